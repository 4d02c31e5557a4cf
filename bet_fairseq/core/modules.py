"""A drop-in BET(SF) causal self-attention for any PyTorch model (batch-first, no fairseq)."""

import math

import torch
from torch import Tensor, nn

from .functional import bet_sf_attention, bet_sf_fused
from .masks import causal_allowed


class BirdEyeSelfAttention(nn.Module):
    """BET(SF) causal self-attention: ``forward(x (B, T, E), padding_mask (B, T) or None) -> (B, T, E)``.

    The same parameters as a standard multi-head attention (q, k, v, out projections) plus ``w``:
    ``2 * head_dim`` values per head (one shared row with ``share_w``). ``keep_diagonal`` drops the
    DiagFreeMask. ``return_attention=True`` also returns the final per-head matrix ``(B, H, T, T)``.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 keep_diagonal: bool = False, share_w: bool = False):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.w = nn.Parameter(torch.empty(1 if share_w else num_heads, 2 * self.head_dim))
        bound = 1.0 / math.sqrt(2 * self.head_dim)
        nn.init.uniform_(self.w, -bound, bound)
        self.keep_diagonal = keep_diagonal
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, padding_mask: Tensor = None, return_attention: bool = False):
        bsz, length, dim = x.shape
        q, k, v = self.qkv(x).view(bsz, length, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q = q * self.head_dim ** -0.5
        allowed = causal_allowed(length, length, x.device)
        if padding_mask is not None:
            allowed = allowed & ~padding_mask.bool().view(bsz, 1, 1, length)
        if return_attention:
            out, probs, _, _, _ = bet_sf_attention(q, k, v, self.w, allowed, self.keep_diagonal, self.dropout)
        else:
            p = self.dropout.p if self.training else 0.0
            out, probs = bet_sf_fused(q, k, v, self.w, allowed, self.keep_diagonal, p), None
        out = self.out_proj(out.transpose(1, 2).reshape(bsz, length, dim))
        return (out, probs) if return_attention else out
