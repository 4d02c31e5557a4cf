"""The decoder self-attention options as model configuration: ``--self-attn-mode`` plus every
registered variant's own options, shown by ``fairseq-train --help`` and stored in the checkpoint."""

import dataclasses
from dataclasses import dataclass, field
from typing import Optional, Set

from fairseq.dataclass import FairseqDataclass
from fairseq.utils import safe_getattr

from .. import attention
from ..compat import register_help
from ..option_history import option_added
from ..errors import InputError


@dataclass
class SelfAttentionModeConfig(FairseqDataclass):
    self_attn_mode: Optional[str] = field(
        default=None,
        metadata={"help": "decoder causal self-attention variant (default: the architecture's, else vanilla): "
                          + ", ".join(sorted(attention.VARIANTS))},
    )
    self_attn_layers: Optional[str] = field(
        default=None,
        metadata={"help": "decoder layers (0-based, e.g. '0-2' or '0,1,2') whose self-attention is "
                          "--self-attn-mode; the other layers use vanilla attention (default: every layer)",
                  # checkpoints from before the option: the variant in every layer
                  **option_added("0.2", before="all")},
    )


def parse_layers(text: Optional[str], num_layers: int) -> Set[int]:
    """The layer indices of ``--self-attn-layers`` (all ``num_layers`` when unset), checked."""
    if text is None or str(text).strip() in ("", "all"):
        return set(range(num_layers))
    layers = set()
    for part in str(text).replace(" ", "").split(","):
        try:
            first, _, last = part.partition("-")
            lo, hi = int(first), int(last or first)
        except ValueError:
            raise InputError(f"--self-attn-layers: {part!r} is not a layer index or range such as '0-2' "
                             f"(got {text!r})") from None
        if not 0 <= lo <= hi < num_layers:
            raise InputError(f"--self-attn-layers: {part!r} is outside the decoder's layers 0-{num_layers - 1}")
        layers.update(range(lo, hi + 1))
    return layers


# Every option dataclass of the variants registered at import (bet_fairseq/attention/*.py), as one.
AttentionConfig = dataclasses.make_dataclass(
    "AttentionConfig", [], bases=(SelfAttentionModeConfig, *reversed(attention.option_classes()))
)


@dataclass
class LegacyAttentionConfig(FairseqDataclass):
    """Checkpoints of bet-fairseq 0.1 stored the baselines' variant as ``--self-attn-baseline``."""

    self_attn_baseline: Optional[str] = field(
        default=None, metadata={"help": "deprecated (checkpoints of version 0.1): use --self-attn-mode"}
    )


def upgrade_legacy_options(args):
    """Map the options of version 0.1 checkpoints onto today's (in place; idempotent)."""
    baseline = safe_getattr(args, "self_attn_baseline", None)
    if baseline is not None:
        mode = safe_getattr(args, "self_attn_mode", None)
        if mode not in (None, "vanilla", baseline):
            raise InputError(f"--self-attn-baseline {baseline} and --self-attn-mode {mode} disagree; "
                             "give --self-attn-mode alone")
        args.self_attn_mode = str(baseline)
        args.self_attn_baseline = None


def add_attention_args(parser):
    """The options as argparse flags (for fairseq's legacy argparse models), defaults left unset so
    that architectures can fill them."""
    from fairseq.dataclass.utils import gen_parser_from_dataclass

    gen_parser_from_dataclass(parser, AttentionConfig(), delete_default=True, with_prefix="")
    gen_parser_from_dataclass(parser, LegacyAttentionConfig(), delete_default=True, with_prefix="")


register_help("bet-fairseq decoder self-attention (--self-attn-mode and each variant's options)", AttentionConfig)
