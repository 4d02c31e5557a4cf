"""Boolean masks and a softmax that never returns NaN for a row without keys."""

from typing import Callable, Optional

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


def diagonal_free(allowed: Tensor, diag: Optional[Tensor] = None) -> Tensor:
    """DiagFreeMask: drop each query's own key, except in a row with no other allowed key (row 0). ``diag``
    (T, S): True at each query's own key; default ``own_position`` (the queries are the last T keys; a static
    cache's queries stand elsewhere among its S slots)."""
    if diag is None:
        diag = own_position(allowed.size(-2), allowed.size(-1), allowed.device)
    has_history = (allowed & ~diag).any(dim=-1, keepdim=True)
    return allowed & ~(diag & has_history)


def diagonal_free_step_(logits: Tensor) -> Tensor:
    """DiagFreeMask in place on the logits (..., 1, S) of one decoding step that sees every key: its own key is the
    last, so -inf there, unless it is the only key (as ``diagonal_free`` keeps a lone diagonal). No mask tensor."""
    if logits.size(-1) > 1:
        logits[..., -1] = float("-inf")
    return logits


def tracing() -> bool:
    """True while torch.compile or torch.export traces the code: there a Python branch on a tensor's values (or
    on its memory address) cannot be taken, so the functions here decide from shapes alone."""
    return torch.compiler.is_compiling()


COMPUTE = object()  # ``empty=COMPUTE`` (the default): find the rows without keys here


def rows_without_keys(allowed: Optional[Tensor]) -> Optional[Tensor]:
    """The rows with no allowed key, (..., T, 1), or None when there is none (the usual case: such rows come
    only from left padding). Computed once per forward and handed to the functions below as ``empty``, so
    that they neither recompute it nor mask rows that need no masking. While tracing (``tracing()``) the tensor
    itself, whatever it holds: the functions below then mask whichever rows it marks, which costs one
    elementwise pass and no branch on data."""
    if allowed is None:
        return None
    empty = ~allowed.any(dim=-1, keepdim=True)
    return empty if tracing() or bool(empty.any()) else None


def masked_softmax(logits: Tensor, allowed: Optional[Tensor], dtype=None, empty=COMPUTE) -> Tensor:
    """softmax over the allowed keys, in float32, returned as ``dtype`` (default: the logits' dtype).

    A row with no allowed key (a left-padding query) gets all-zero weights, never NaN, so nothing
    spreads into real positions through 0 * NaN in later layers or in the gradient. ``empty``: the
    ``rows_without_keys(allowed)`` of the caller, if it has them.
    """
    dtype = dtype or logits.dtype
    logits = logits.float()
    if allowed is None:
        return F.softmax(logits, dim=-1).to(dtype)
    if empty is COMPUTE:
        empty = rows_without_keys(allowed)
    if empty is None:
        return F.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1).to(dtype)
    probs = F.softmax(logits.masked_fill(~(allowed | empty), float("-inf")), dim=-1)
    return probs.masked_fill(empty, 0.0).to(dtype)


def masked_log_softmax(logits: Tensor, allowed: Optional[Tensor], empty=COMPUTE) -> Tensor:
    """log of ``masked_softmax``, computed in log space (float32): a weight that underflows to 0 still has
    a finite log and a gradient. Masked keys get -inf; a row with no allowed key gets finite values that
    carry no meaning (its weights are zeros). ``empty`` as ``masked_softmax``."""
    logits = logits.float()
    if allowed is not None:
        if empty is COMPUTE:
            empty = rows_without_keys(allowed)
        logits = logits.masked_fill(~(allowed if empty is None else allowed | empty), float("-inf"))
    return F.log_softmax(logits, dim=-1)


def safe_sdpa(q: Tensor, k: Tensor, v: Tensor, allowed: Optional[Tensor], dropout_p: float = 0.0,
              empty=COMPUTE) -> Tensor:
    """``scaled_dot_product_attention`` with scale 1 (q comes scaled) and zero output for rows
    without keys (SDPA itself returns NaN there). ``empty`` as ``masked_softmax``."""
    if allowed is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=1.0)
    if empty is COMPUTE:
        empty = rows_without_keys(allowed)
    if empty is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p, scale=1.0)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | empty, dropout_p=dropout_p, scale=1.0)
    return out.masked_fill(empty, 0.0)


class LastMaskMemo:
    """Remembers ``fn(mask, *extra)`` for the last mask it was called with. Every layer of a model derives the same
    masks from the same mask tensor in a forward (fairseq hands each layer a view of one buffered causal mask),
    and on CPU those boolean scans cost about 3 ms per layer at 512 tokens, a tenth of BET's attention there.

    A mask counts as the same when it views the same memory the same way (storage, offset, shape, strides, dtype)
    and has not been written to since (its version counter); the memo holds the mask, so that its memory cannot
    be freed and reused by another tensor while it is remembered. ``extra`` must be hashable. Results are shared
    between callers: nobody may write into them. While tracing (``tracing()``) it calls ``fn`` every time: a traced
    tensor has no memory address to compare, and a compiled graph derives the masks once anyway."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.last = None

    @staticmethod
    def key(mask: Tensor, extra):
        return (mask.untyped_storage().data_ptr(), mask.storage_offset(), tuple(mask.shape), mask.stride(),
                mask.dtype, mask.device, mask._version, extra)

    def forget(self):
        """Drop the remembered result (when what ``fn`` calls has changed, as a benchmark's settings)."""
        self.last = None

    def __call__(self, mask: Tensor, *extra):
        if tracing() or mask.is_inference():  # no version counter: a write could not be seen
            return self.fn(mask, *extra)
        key = self.key(mask, extra)
        if self.last is not None and self.last[1] == key:
            return self.last[2]
        value = self.fn(mask, *extra)
        self.last = (mask, key, value)
        return value
