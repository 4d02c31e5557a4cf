"""The diagonal ablations of the paper: Reduced / Magnified Diag (``diag_scale``) and DiagFreeMask."""

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from fairseq.dataclass import FairseqDataclass

from ..core.functional import scale_diagonal
from ..core.masks import diagonal_free, diagonal_free_step_, own_position
from . import Attended, SelfAttentionVariant, register_variant
from ..errors import InputError


@dataclass
class DiagScaleOptions(FairseqDataclass):
    diag_scale: float = field(
        default=1.0,
        metadata={"help": "diag_scale: factor c >= 0 on the diagonal logits (0.2 Reduced, 2.0 Magnified; 0 sets them to 0, "
                          "which is not DiagFreeMask's -inf)"},
    )


@register_variant("diag_scale", options=DiagScaleOptions)
class DiagScaleSelfAttention(SelfAttentionVariant):
    """Each query's own logit ``D_ii`` times ``c`` before the softmax."""

    @classmethod
    def check_options(cls, options, num_heads):
        try:
            scale = float(options.diag_scale)
        except (TypeError, ValueError):
            raise InputError(f"--diag-scale must be a number, got {options.diag_scale!r}") from None
        if not math.isfinite(scale) or scale < 0:
            raise InputError(
                f"--diag-scale must be a finite number >= 0 (it multiplies the diagonal logits; "
                f"use --self-attn-mode diag_free to remove the diagonal), got {scale}"
            )

    def scores(self, q, k, allowed):
        return scale_diagonal(super().scores(q, k, allowed), float(self.options.diag_scale))

    def attend(self, q, k, v, allowed, cache, exact):
        if exact or not self.use_fused_attention:
            return super().attend(q, k, v, allowed, cache, exact)
        # D_ii * c = D_ii + (c - 1) D_ii: an additive bias on the diagonal only, for one SDPA call.
        tgt_len, src_len = q.size(2), k.size(2)
        diag = own_position(tgt_len, src_len, q.device)
        own = (q * k[:, :, src_len - tgt_len:]).sum(-1).float()  # (B, H, T) = D_ii
        bias = torch.where(diag, ((float(self.options.diag_scale) - 1.0) * own).unsqueeze(-1), 0.0)
        empty = ~allowed.any(dim=-1, keepdim=True)  # a row without keys: zero output, as masked_softmax
        bias = bias.masked_fill(~(allowed | empty), float("-inf")).to(q.dtype)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=self.dropout_p(), scale=1.0)
        return Attended(out.masked_fill(empty, 0.0))


@register_variant("diag_free")
class DiagFreeSelfAttention(SelfAttentionVariant):
    """DiagFreeMask: a query does not see itself, except a row with no other key (row 0)."""

    masks_diagonal = True

    def restrict(self, q, k, allowed):
        return diagonal_free(allowed)

    def attend(self, q, k, v, allowed, cache, exact):
        if allowed is None and q.size(2) == 1:
            # one decoding step that sees every key: no causal and diagonal masks built at every step
            return self.attend_to_logits(diagonal_free_step_(self.scores(q, k, None)), None, v)
        return super().attend(q, k, v, allowed, cache, exact)
