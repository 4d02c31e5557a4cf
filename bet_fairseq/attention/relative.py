"""Transformer-XL's relative multi-head attention (Dai et al. 2019, section 3.3).

For query i at position M + i after M earlier positions (memory, or cached keys) and key j:

    A_ij = (q_i + u)^T k_j + (q_i + v)^T W_R R_{M+i-j}       (terms (a)+(c) and (b)+(d) of the paper)

with ``R_d`` the sinusoid of the distance d, ``W_R`` a projection and ``u, v`` learnt per-head biases,
then the causal mask, softmax with scale 1/sqrt(d_head) and ``A V W_o``. What stays special about
Transformer-XL lives in its model (``models/transformer_xl_lm.py``), not here: the segment memory of
each layer's earlier *hidden states* (detached, re-projected with the current weights), handed to this
module as a key context longer than the queries. As a ``--self-attn-mode`` on the other architectures it
is relative attention over the sequence alone.

Incremental decoding uses the base class's key/value cache: a step's query is the last of the keys, so
its distances are those of the full forward. With ``same_length`` (each query sees its last N positions)
the cache keeps only the last N - 1 keys, which is all a later query can see.
"""

import torch
from torch import nn

from ..core.baselines import relative_logits, relative_sinusoids
from ..core.masks import own_position
from . import SelfAttentionVariant, register_variant
from ..errors import InputError


@register_variant("relative")
class RelativeSelfAttention(SelfAttentionVariant):
    def __init__(self, embed_dim, num_heads, options=None, **kwargs):
        if embed_dim % 2:
            raise InputError(f"relative attention needs an even embedding dim (sin/cos pairs), got {embed_dim}")
        super().__init__(embed_dim, num_heads, options=options, **kwargs)
        self.r_proj = nn.Linear(embed_dim, embed_dim, bias=False)  # W_R
        self.u_bias = nn.Parameter(torch.empty(num_heads, self.head_dim))
        self.v_bias = nn.Parameter(torch.empty(num_heads, self.head_dim))
        for p in (self.u_bias, self.v_bias):
            nn.init.normal_(p, std=0.02)
        self.clamp_len = None  # or the largest distance with its own embedding
        self.same_length = None  # or the number of positions each query sees

    def restrict(self, q, k, allowed):
        if self.same_length is None:
            return allowed
        tgt_len, src_len = q.size(2), k.size(2)
        own = own_position(tgt_len, src_len, q.device).float().argmax(-1, keepdim=True)  # (T, 1)
        return allowed & ((own - torch.arange(src_len, device=q.device)) < self.same_length)

    def forward(self, query, key, value, key_padding_mask=None, incremental_state=None, need_weights=True,
                static_kv=False, attn_mask=None, before_softmax=False, need_head_weights=False):
        result = super().forward(query, key, value, key_padding_mask=key_padding_mask,
                                 incremental_state=incremental_state, need_weights=need_weights, static_kv=static_kv,
                                 attn_mask=attn_mask, before_softmax=before_softmax,
                                 need_head_weights=need_head_weights)
        if incremental_state is not None and self.same_length is not None:
            self.keep_last_keys(incremental_state, self.same_length - 1)
        return result

    def keep_last_keys(self, incremental_state, n: int):
        """Drop all but the last ``n`` cached keys (and values, padding): no later query can see them."""
        saved = self._get_input_buffer(incremental_state)
        for name, t in saved.items():
            if t is not None:
                dim = 1 if name == "prev_key_padding_mask" else 2  # (B, S) or (B, H, S, ...)
                if t.size(dim) > n:
                    saved[name] = t.narrow(dim, t.size(dim) - n, n)
        self._set_input_buffer(incremental_state, saved)

    def scores(self, q, k, allowed):
        src_len = k.size(2)
        # distances past clamp_len read r of clamp_len: the larger ones are never needed
        n_dist = src_len if self.clamp_len is None else min(src_len, self.clamp_len + 1)
        r = self.r_proj(relative_sinusoids(n_dist, self.embed_dim, q.device, q.dtype))
        r = r.view(n_dist, self.num_heads, self.head_dim).transpose(0, 1)  # (H, distance, d)
        # q comes scaled, so the biases are too: ((q + u) k + (q + v) r) / sqrt(d).
        return relative_logits(q, k, r, self.u_bias * self.scaling, self.v_bias * self.scaling, self.clamp_len)
