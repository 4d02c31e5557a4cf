"""Options, decoder layer and decoder for the baseline self-attentions (``baseline_attention``).

The options are one dataclass shared by the translation and LM models; every field becomes a
``fairseq-train`` flag and is stored in the checkpoint, so fairseq-generate / fairseq-eval-lm
rebuild the same attention. Only the decoder self-attention changes (as for BET).
"""

from dataclasses import dataclass, field
from typing import Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models.transformer.transformer_config import TransformerConfig
from fairseq.utils import safe_getattr

from .baseline_attention import BASELINES, build_baseline_attention, validate_baseline_settings
from .bird_eye_decoder import BirdEyeDecoderLayer, BirdEyeTransformerDecoder


@dataclass
class BaselineAttentionConfig(FairseqDataclass):
    self_attn_baseline: Optional[ChoiceEnum(list(BASELINES))] = field(
        default=None,
        metadata={
            "help": "decoder causal self-attention of a published baseline: localness (Yang et al. "
            "2018, Gaussian bias), sparse_topk (Zhao et al. 2019, top-k logits), hopfield (Ramsauer "
            "et al. 2020, Hopfield layer); set by the localness_* / sparse_topk_* / hopfield_* archs"
        },
    )
    sparse_topk: Optional[int] = field(
        default=None,
        metadata={"help": "sparse_topk: logits kept per row, k >= 1 (default 8; ties with the k-th are kept)"},
    )
    hopfield_beta: Optional[float] = field(
        default=None,
        metadata={"help": "hopfield: inverse temperature beta > 0 (default 1/sqrt(head dim))"},
    )
    hopfield_steps: Optional[int] = field(
        default=None,
        metadata={"help": "hopfield: update steps >= 1 (default 1; more iterate xi <- softmax(beta xi K^T) K)"},
    )


BASELINE_OPTIONS = ("self_attn_baseline", "sparse_topk", "hopfield_beta", "hopfield_steps")


def baseline_settings(args) -> dict:
    """The validated baseline settings of a model namespace/config."""
    baseline = safe_getattr(args, "self_attn_baseline", None)
    if baseline is None:
        raise ValueError(
            f"no --self-attn-baseline given; choose one of {', '.join(BASELINES)} "
            "(or use an architecture that sets it: localness_iwslt, sparse_topk_lm, hopfield_wmt_en_de, ...)"
        )
    return validate_baseline_settings(
        str(baseline),
        sparse_topk=safe_getattr(args, "sparse_topk", None),
        hopfield_beta=safe_getattr(args, "hopfield_beta", None),
        hopfield_steps=safe_getattr(args, "hopfield_steps", None),
    )


def reject_bet_modes(args):
    """A baseline replaces the self-attention: the BET options must stay at their defaults."""
    mode = str(safe_getattr(args, "self_attn_mode", "vanilla") or "vanilla")
    if mode != "vanilla" or safe_getattr(args, "bet_keep_diagonal", False) or safe_getattr(args, "bet_share_w", False) \
            or float(safe_getattr(args, "diag_scale", 1.0) or 1.0) != 1.0:
        raise ValueError(
            "--self-attn-mode/--diag-scale/--bet-* do not apply to a --self-attn-baseline model "
            f"(baseline {safe_getattr(args, 'self_attn_baseline', None)!r} replaces the self-attention); "
            "use a bet_* or transformer_*_diag* architecture for those"
        )


class BaselineDecoderLayer(BirdEyeDecoderLayer):
    def __init__(self, args, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        self._baseline_settings = baseline_settings(args)  # read before the self-attention is built
        super().__init__(args, no_encoder_attn, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)

    def build_self_attention(self, embed_dim, args, add_bias_kv=False, add_zero_attn=False):
        cfg = TransformerConfig.from_namespace(args)
        if cfg.cross_self_attention:
            raise ValueError("--cross-self-attention is not supported with --self-attn-baseline")
        return build_baseline_attention(
            embed_dim,
            cfg.decoder.attention_heads,
            dropout=cfg.attention_dropout,
            add_bias_kv=add_bias_kv,
            add_zero_attn=add_zero_attn,
            self_attention=True,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            **self._baseline_settings,
        )


class BaselineTransformerDecoder(BirdEyeTransformerDecoder):
    layer_class = BaselineDecoderLayer
