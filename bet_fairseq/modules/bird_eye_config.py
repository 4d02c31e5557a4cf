"""The decoder self-attention options, as one dataclass shared by the translation and LM models.

Every field becomes a ``fairseq-train`` flag (``--self-attn-mode`` ...) and is stored in the
checkpoint with the rest of the model arguments, so fairseq-generate / fairseq-eval-lm rebuild the
same attention.
"""

from dataclasses import dataclass, field

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.utils import safe_getattr

from .bird_eye_attention import ATTENTION_MODES, validate_attention_settings

SelfAttnMode = ChoiceEnum(list(ATTENTION_MODES))


@dataclass
class BirdEyeAttentionConfig(FairseqDataclass):
    self_attn_mode: SelfAttnMode = field(
        default="vanilla",
        metadata={
            "help": "decoder causal self-attention: vanilla (fairseq's), diag_scale (diagonal "
            "logits times --diag-scale), diag_free (DiagFreeMask), bet_sf (BET(SF) re-weighting)"
        },
    )
    diag_scale: float = field(
        default=1.0,
        metadata={"help": "diag_scale mode: factor c > 0 on the diagonal logits (0.2 Reduced, 2.0 Magnified)"},
    )
    bet_keep_diagonal: bool = field(
        default=False,
        metadata={"help": "bet_sf mode: keep the diagonal (no DiagFreeMask; the 'BET(SF) - DiagFreeMask' row)"},
    )
    bet_share_w: bool = field(
        default=False,
        metadata={"help": "bet_sf mode: one w shared by all heads instead of one w per head"},
    )


def attention_settings(args) -> dict:
    """The module's keyword arguments from a model namespace/config, validated."""
    settings = dict(
        mode=str(safe_getattr(args, "self_attn_mode", "vanilla")),
        diag_scale=safe_getattr(args, "diag_scale", 1.0),
        keep_diagonal=bool(safe_getattr(args, "bet_keep_diagonal", False)),
        share_w=bool(safe_getattr(args, "bet_share_w", False)),
    )
    settings["diag_scale"] = validate_attention_settings(**settings)
    return settings


def set_attention_defaults(args, **defaults):
    """Architecture helper: fill unset attention options, keeping what the user passed."""
    for name, value in defaults.items():
        if safe_getattr(args, name, None) is None:
            setattr(args, name, value)
    for fld, default in (("self_attn_mode", "vanilla"), ("diag_scale", 1.0),
                         ("bet_keep_diagonal", False), ("bet_share_w", False)):
        if safe_getattr(args, fld, None) is None:
            setattr(args, fld, default)
