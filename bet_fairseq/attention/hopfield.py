"""Ramsauer et al. 2020, "Hopfield Networks is All You Need": the Hopfield layer as causal self-attention.

``Z = softmax(beta R W_Q W_K^T Y^T) Y W_K W_V`` with R = Y = the layer input: state patterns
``xi = R W_Q``, stored patterns ``K = Y W_K``, pattern projection ``V = (Y W_K) W_V`` (the value
projection is applied to the keys). ``steps`` > 1 iterates the update in the key space,
``xi <- softmax(beta xi K^T) K``, before the final ``softmax(beta xi K^T) V``; every softmax is causal.
With steps=1 and beta = 1/sqrt(d_head) it is standard attention with ``W_V' = W_K W_V``.
"""

import math
from dataclasses import dataclass, field
from typing import Optional

from fairseq.dataclass import FairseqDataclass

from ..core.functional import hopfield_logits
from . import SelfAttentionVariant, register_variant


@dataclass
class HopfieldOptions(FairseqDataclass):
    hopfield_beta: Optional[float] = field(
        default=None, metadata={"help": "hopfield: inverse temperature beta > 0 (default 1/sqrt(head dim))"}
    )
    hopfield_steps: Optional[int] = field(
        default=None,
        metadata={"help": "hopfield: update steps >= 1 (default 1; more iterate xi <- softmax(beta xi K^T) K)"},
    )


@register_variant("hopfield", options=HopfieldOptions)
class HopfieldSelfAttention(SelfAttentionVariant):
    @classmethod
    def check_options(cls, options, num_heads):
        steps = options.hopfield_steps
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise ValueError(f"--hopfield-steps must be a whole number >= 1 (update steps), got {steps!r}")
        beta = options.hopfield_beta
        if beta is not None:
            try:
                beta = float(beta)
            except (TypeError, ValueError):
                raise ValueError(f"--hopfield-beta must be a number, got {beta!r}") from None
            if not math.isfinite(beta) or beta <= 0:
                raise ValueError(f"--hopfield-beta must be a finite number > 0 (the inverse temperature), got {beta}")

    def __init__(self, embed_dim, num_heads, options=None, **kwargs):
        super().__init__(embed_dim, num_heads, options=options, **kwargs)
        beta = self.options.hopfield_beta
        self.hopfield_beta = 1.0 / math.sqrt(self.head_dim) if beta is None else float(beta)
        self.hopfield_steps = self.options.hopfield_steps or 1

    def project(self, query, context):
        keys = self.k_proj(context)
        q = self.split_heads(self.q_proj(query))  # unscaled: beta is the temperature
        return q, self.split_heads(keys), self.split_heads(self.v_proj(keys))  # pattern projection Y W_K W_V

    def scores(self, q, k, allowed):
        return hopfield_logits(q, k, self.hopfield_beta, self.hopfield_steps, allowed)
