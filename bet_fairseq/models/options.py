"""The decoder self-attention options as model configuration: ``--self-attn-mode`` plus every
registered variant's own options, shown by ``fairseq-train --help`` and stored in the checkpoint."""

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from fairseq.dataclass import FairseqDataclass
from fairseq.utils import safe_getattr

from .. import attention
from ..compat import register_help


@dataclass
class SelfAttentionModeConfig(FairseqDataclass):
    self_attn_mode: Optional[str] = field(
        default=None,
        metadata={"help": "decoder causal self-attention variant (default: the architecture's, else vanilla): "
                          + ", ".join(sorted(attention.VARIANTS))},
    )


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
            raise ValueError(f"--self-attn-baseline {baseline} and --self-attn-mode {mode} disagree; "
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
