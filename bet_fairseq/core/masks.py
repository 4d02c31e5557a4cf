"""Boolean masks and a softmax that never returns NaN for a row without keys."""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor


def causal_allowed(tgt_len: int, src_len: int, device=None) -> Tensor:
    """(1, 1, T, S): query i (at position S - T + i) sees keys 0 .. S - T + i."""
    qpos = torch.arange(src_len - tgt_len, src_len, device=device).unsqueeze(1)
    return (torch.arange(src_len, device=device).unsqueeze(0) <= qpos).view(1, 1, tgt_len, src_len)


def own_position(tgt_len: int, src_len: int, device=None) -> Tensor:
    """(T, S): True at each query's own key (the diagonal of a causal block)."""
    offset = src_len - tgt_len
    return torch.arange(src_len, device=device).unsqueeze(0) == (
        torch.arange(tgt_len, device=device).unsqueeze(1) + offset
    )


def diagonal_free(allowed: Tensor) -> Tensor:
    """DiagFreeMask: drop each query's own key, except in a row with no other allowed key (row 0)."""
    diag = own_position(allowed.size(-2), allowed.size(-1), allowed.device)
    has_history = (allowed & ~diag).any(dim=-1, keepdim=True)
    return allowed & ~(diag & has_history)


def masked_softmax(logits: Tensor, allowed: Optional[Tensor], dtype=None) -> Tensor:
    """softmax over the allowed keys, in float32, returned as ``dtype`` (default: the logits' dtype).

    A row with no allowed key (a left-padding query) gets all-zero weights, never NaN, so nothing
    spreads into real positions through 0 * NaN in later layers or in the gradient.
    """
    dtype = dtype or logits.dtype
    logits = logits.float()
    if allowed is None:
        return F.softmax(logits, dim=-1).to(dtype)
    empty = ~allowed.any(dim=-1, keepdim=True)
    probs = F.softmax(logits.masked_fill(~(allowed | empty), float("-inf")), dim=-1)
    return probs.masked_fill(empty, 0.0).to(dtype)


def masked_log_softmax(logits: Tensor, allowed: Optional[Tensor]) -> Tensor:
    """log of ``masked_softmax``, computed in log space (float32): a weight that underflows to 0 still has
    a finite log and a gradient. Masked keys get -inf; a row with no allowed key gets finite values that
    carry no meaning (its weights are zeros)."""
    logits = logits.float()
    if allowed is not None:
        empty = ~allowed.any(dim=-1, keepdim=True)
        logits = logits.masked_fill(~(allowed | empty), float("-inf"))
    return F.log_softmax(logits, dim=-1)


def safe_sdpa(q: Tensor, k: Tensor, v: Tensor, allowed: Optional[Tensor], dropout_p: float = 0.0) -> Tensor:
    """``scaled_dot_product_attention`` with scale 1 (q comes scaled) and zero output for rows
    without keys (SDPA itself returns NaN there)."""
    if allowed is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=1.0)
    empty = ~allowed.any(dim=-1, keepdim=True)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | empty, dropout_p=dropout_p, scale=1.0)
    return out.masked_fill(empty, 0.0)
