"""Transformer-XL relative multi-head attention (Dai et al. 2019, section 3.3).

For query i of the current segment (absolute position M + i after M memory positions) and key j of
``[memory ; segment]`` the score is

    A_ij = (q_i + u)^T k_j + (q_i + v)^T W_R R_{M+i-j}       (terms (a)+(c) and (b)+(d) of the paper)

with ``q = W_q h``, ``k = W_k [mem ; h]``, ``R_d`` the sinusoid of the distance d (``R_d = [sin(d f) ;
cos(d f)]``, f = 10000^{-2k/dim}), ``W_R`` a projection, and ``u, v`` learnt per-head biases; then the
causal mask (j <= M + i), softmax with scale 1/sqrt(d_head), and ``A V W_o``. Memory never receives a
gradient (the caller detaches it). The (b)+(d) term is computed for every distance once and gathered
into the (i, j) grid (no "relative shift" trick, which is the same numbers).
"""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fairseq.modules.fairseq_dropout import FairseqDropout


def relative_sinusoids(length: int, dim: int, device=None, dtype=torch.float) -> Tensor:
    """R_d for the distances d = 0 .. length-1: (length, dim)."""
    if dim % 2:
        raise ValueError(f"the relative sinusoid needs an even model dimension, got {dim}")
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=device, dtype=torch.float) / dim))
    angles = torch.arange(length, device=device, dtype=torch.float).unsqueeze(1) * inv_freq
    return torch.cat([angles.sin(), angles.cos()], dim=-1).to(dtype)


class RelativeMultiheadAttention(nn.Module):
    """Batch-first: ``forward(x (B, T, E), memory (B, M, E) or None) -> (out (B, T, E), probs)``."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"embedding dim {embed_dim} is not divisible by {num_heads} attention heads")
        if embed_dim % 2:
            raise ValueError(f"Transformer-XL needs an even embedding dim (sin/cos pairs), got {embed_dim}")
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim ** -0.5
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.r_proj = nn.Linear(embed_dim, embed_dim, bias=False)  # W_R
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.u_bias = nn.Parameter(torch.empty(num_heads, self.head_dim))
        self.v_bias = nn.Parameter(torch.empty(num_heads, self.head_dim))
        for p in (self.u_bias, self.v_bias):
            nn.init.normal_(p, std=0.02)
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)
        self.capture_attention = False
        self.captured_attention: Optional[Tensor] = None

    def _heads(self, x: Tensor) -> Tensor:
        return x.view(x.size(0), x.size(1), self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, L, d)

    def forward(self, x: Tensor, memory: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        bsz, tgt_len, _ = x.shape
        context = x if memory is None else torch.cat([memory, x], dim=1)
        src_len = context.size(1)
        mem_len = src_len - tgt_len
        q = self._heads(self.q_proj(x))
        k, v = self._heads(self.k_proj(context)), self._heads(self.v_proj(context))
        r = self.r_proj(relative_sinusoids(src_len, self.embed_dim, x.device, x.dtype))
        r = r.view(src_len, self.num_heads, self.head_dim).transpose(0, 1)  # (H, distance, d)

        content = torch.matmul(q + self.u_bias.unsqueeze(1), k.transpose(-1, -2))  # (a) + (c)
        by_distance = torch.matmul(q + self.v_bias.unsqueeze(1), r.transpose(-1, -2))  # (b) + (d), (B,H,T,dist)
        qpos = torch.arange(mem_len, src_len, device=x.device).unsqueeze(1)
        distance = qpos - torch.arange(src_len, device=x.device).unsqueeze(0)  # (T, S), M + i - j
        position = by_distance.gather(-1, distance.clamp(min=0).expand(bsz, self.num_heads, -1, -1))
        scores = ((content + position) * self.scaling).masked_fill(distance < 0, float("-inf"))
        probs = F.softmax(scores.float(), dim=-1).to(x.dtype)
        if self.capture_attention:
            self.captured_attention = probs
        out = torch.matmul(self.dropout_module(probs), v)
        out = out.transpose(1, 2).reshape(bsz, tgt_len, self.embed_dim)
        return self.out_proj(out), probs
