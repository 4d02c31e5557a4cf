"""Yang et al. 2018, "Modeling Localness for Self-Attention Networks": a learned Gaussian bias.

``G_ij = -(j - P_i)^2 / (2 sigma_i^2)`` is added to the logits, with ``P_i = I_i sigmoid(U_p^T
tanh(W_p Q_i))``, ``D_i = I_i sigmoid(U_d^T tanh(W_p Q_i))``, ``sigma_i = D_i / 2``. Q_i is the full
(all heads) query of position i, so one window per query is shared by the heads (the paper's W_p in
R^{d x d}, U_p, U_d in R^d). The paper's I is the sequence length (an encoder sees every position);
causal, query i sees the keys 0..i, so ``I_i = i`` (``--localness-centre-scale i``, the default) keeps
the centre P_i in (0, i), inside the visible keys; ``i+1`` (version 0.1) lets it pass the query's own
position by up to one. P and D depend only on query i, so a decoding step needs nothing cached beyond K
and V. The bias is float32.
"""

from dataclasses import dataclass, field
from typing import Tuple

import torch
from torch import Tensor, nn

from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from ..option_history import option_added
from ..core.baselines import localness_bias
from . import SelfAttentionVariant, register_variant
from ..errors import InputError

CENTRE_SCALES = {"i": 0, "i+1": 1}  # I_i = position + offset


@dataclass
class LocalnessOptions(FairseqDataclass):
    localness_centre_scale: ChoiceEnum(list(CENTRE_SCALES)) = field(
        default="i",
        metadata={"help": "localness: I_i, the scale of the predicted centre P_i = I_i sigmoid(.) and width D_i of "
                          "query i (0-based): 'i' keeps P_i in (0, i), the keys it sees; 'i+1' (version 0.1) lets "
                          "P_i reach past i",
                  **option_added("0.2", before="i+1")},  # checkpoints from before the option scaled by i + 1
    )


@register_variant("localness", options=LocalnessOptions)
class LocalnessSelfAttention(SelfAttentionVariant):
    @classmethod
    def check_options(cls, options, num_heads):
        scale = str(options.localness_centre_scale)
        if scale not in CENTRE_SCALES:
            raise InputError(f"--localness-centre-scale: unknown scale {scale!r}; "
                             f"choose one of {', '.join(CENTRE_SCALES)}")

    def __init__(self, embed_dim, num_heads, options=None, **kwargs):
        super().__init__(embed_dim, num_heads, options=options, **kwargs)
        self.centre_offset = CENTRE_SCALES[str(self.options.localness_centre_scale)]
        self.localness_w_p = nn.Linear(embed_dim, embed_dim, bias=False)  # W_p, shared by P and D
        self.localness_u = nn.Linear(embed_dim, 2, bias=False)  # rows: U_p, U_d
        nn.init.xavier_uniform_(self.localness_w_p.weight)
        nn.init.xavier_uniform_(self.localness_u.weight)

    def window(self, q_full: Tensor, positions: Tensor) -> Tuple[Tensor, Tensor]:
        """Centre P and width D per query, (B, T) each, for the (T, B, E) unscaled queries at ``positions``."""
        scale = (positions + self.centre_offset).to(q_full.dtype).unsqueeze(1)  # I_i, (T, 1)
        scores = torch.sigmoid(self.localness_u(torch.tanh(self.localness_w_p(q_full))))  # (T, B, 2)
        return (scale * scores[..., 0]).transpose(0, 1), (scale * scores[..., 1]).transpose(0, 1)

    def scores(self, q, k, allowed):
        bsz, heads, tgt_len, _ = q.shape
        src_len = k.size(2)
        q_full = (q / self.scaling).permute(2, 0, 1, 3).reshape(tgt_len, bsz, heads * self.head_dim)
        centre, width = self.window(q_full, torch.arange(src_len - tgt_len, src_len, device=q.device))
        return super().scores(q, k, allowed).float() + localness_bias(centre, width, src_len)
