"""Zhao et al. 2019, "Explicit Sparse Transformer": only the top-k logits of each row take part.

In each row of the scaled logits the entries >= the k-th largest allowed one are kept, the rest set
to -inf before the softmax. Ties with the k-th value are all kept (the paper's threshold rule, so a row
may keep more than k); a row with fewer than k allowed keys keeps them all.
"""

from dataclasses import dataclass, field
from typing import Optional

from fairseq.dataclass import FairseqDataclass

from ..core.functional import top_k_keep
from . import SelfAttentionVariant, register_variant

DEFAULT_SPARSE_TOPK = 8


@dataclass
class SparseTopKOptions(FairseqDataclass):
    sparse_topk: Optional[int] = field(
        default=None,
        metadata={"help": f"sparse_topk: logits kept per row, k >= 1 (default {DEFAULT_SPARSE_TOPK}; "
                          "ties with the k-th are kept)"},
    )


@register_variant("sparse_topk", options=SparseTopKOptions)
class SparseTopKSelfAttention(SelfAttentionVariant):
    @classmethod
    def check_options(cls, options, num_heads):
        k = options.sparse_topk
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"--sparse-topk must be a whole number >= 1 (the logits kept per row), got {k!r}")

    @property
    def top_k(self) -> int:
        return DEFAULT_SPARSE_TOPK if self.options.sparse_topk is None else self.options.sparse_topk

    def scores(self, q, k, allowed):
        logits = super().scores(q, k, allowed)
        return logits.masked_fill(~top_k_keep(logits.detach(), allowed, self.top_k), float("-inf"))
