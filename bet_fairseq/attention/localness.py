"""Yang et al. 2018, "Modeling Localness for Self-Attention Networks": a learned Gaussian bias.

``G_ij = -(j - P_i)^2 / (2 sigma_i^2)`` is added to the logits, with ``P_i = I_i sigmoid(U_p^T
tanh(W_p Q_i))``, ``D_i = I_i sigmoid(U_d^T tanh(W_p Q_i))``, ``sigma_i = D_i / 2``. Q_i is the full
(all heads) query of position i, so one window per query is shared by the heads (the paper's W_p in
R^{d x d}, U_p, U_d in R^d). Causal: ``I_i = i + 1``, the number of keys query i can see, so P_i lies in
the visible prefix and a decoding step needs nothing cached beyond K and V. The bias is float32.
"""

from typing import Tuple

import torch
from torch import Tensor, nn

from ..core.functional import localness_bias
from . import SelfAttentionVariant, register_variant


@register_variant("localness")
class LocalnessSelfAttention(SelfAttentionVariant):
    def __init__(self, embed_dim, num_heads, options=None, **kwargs):
        super().__init__(embed_dim, num_heads, options=options, **kwargs)
        self.localness_w_p = nn.Linear(embed_dim, embed_dim, bias=False)  # W_p, shared by P and D
        self.localness_u = nn.Linear(embed_dim, 2, bias=False)  # rows: U_p, U_d
        nn.init.xavier_uniform_(self.localness_w_p.weight)
        nn.init.xavier_uniform_(self.localness_u.weight)

    def window(self, q_full: Tensor, positions: Tensor) -> Tuple[Tensor, Tensor]:
        """Centre P and width D per query, (B, T) each, for the (T, B, E) unscaled queries at ``positions``."""
        visible = (positions + 1).to(q_full.dtype).unsqueeze(1)  # I_i = i + 1, (T, 1)
        scores = torch.sigmoid(self.localness_u(torch.tanh(self.localness_w_p(q_full))))  # (T, B, 2)
        return (visible * scores[..., 0]).transpose(0, 1), (visible * scores[..., 1]).transpose(0, 1)

    def scores(self, q, k, allowed):
        bsz, heads, tgt_len, _ = q.shape
        src_len = k.size(2)
        q_full = (q / self.scaling).permute(2, 0, 1, 3).reshape(tgt_len, bsz, heads * self.head_dim)
        centre, width = self.window(q_full, torch.arange(src_len - tgt_len, src_len, device=q.device))
        return super().scores(q, k, allowed).float() + localness_bias(centre, width, src_len)
