"""The fused kernels of BET(SF): the equations of ``core/functional.py`` computed without keeping the T x S
matrices A and A' for the backward, so that training memory grows linearly with the sequence. Each kernel gives
the equations' numbers within float rounding (tests/core); ``core/paths.py`` decides which one runs.

- ``_BetSFCausal`` (CPU): both passes on one ``Q K^T`` per query range, with a hand-written backward.
- ``bet_sf_causal_sdpa`` (GPUs, plain causal mask): three SDPA calls and no mask tensor.
- ``bet_sf_folded_sdpa`` (any other case): ``(Q K^T) * R = Q (R ⊙ K)^T`` column by column, so the second pass is
  one SDPA call over keys scaled by R, after a first pass that keeps only ``A (V w_h)``
  (``first_pass_value_scores``: SDPA on GPUs, ``_FirstPassValueScores`` by query ranges on CPU).
- ``bet_authors_fused``: the authors' form (``core/author_form.py``) by the same folding, two SDPA calls.
"""

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .author_form import bet_authors_r
from .functional import bet_key_scores, second_pass_allowed, split_bet_w
from .masks import COMPUTE, LastMaskMemo, masked_softmax, rows_without_keys, safe_sdpa


# ------------------------------------------------------------------------------------ query ranges
def query_chunks(allowed: Optional[Tensor], tgt_len: int, src_len: int, chunk: int = 64, most: int = 16):
    """Query row ranges ``[s, e)`` of about ``chunk`` rows (at most ``most`` ranges): under a causal mask the
    rows of range ``[s, e)`` see only the first ``S - T + e`` keys, so attending range by range skips most of
    the masked upper triangle (about (n + 1) / 2n of the work for n ranges). One range when ``allowed``
    lets any query see a later key (or is None). 64 rows, at most 16 ranges: the fastest of 128 x 8, 64 x 8,
    64 x 16 and 32 x 32 for the BET(SF) kernel at T = 128, 512 and 1024 (docs/performance.md)."""
    if allowed is None or bool(allowed.triu(1 + src_len - tgt_len).any()):
        return [(0, tgt_len)]
    n = max(1, min(most, tgt_len // chunk))
    bounds = [round(tgt_len * i / n) for i in range(n + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def _chunk_probs(q: Tensor, k: Tensor, bias: Optional[Tensor], s: int, e: int) -> Tensor:
    """float32 softmax of the query rows ``[s, e)`` over the keys they may see (``bias``: 0 / -inf)."""
    key_end = k.size(2) - q.size(2) + e
    d = torch.matmul(q[:, :, s:e], k[:, :, :key_end].transpose(-1, -2)).float()
    if bias is not None:
        d.add_(bias[..., s:e, :key_end])
    return torch.softmax(d, dim=-1)


# ------------------------------------------------------------------------------------ the first pass alone
class _FirstPassValueScores(torch.autograd.Function):
    """``softmax(D + bias) (V w_h)`` query range by range, storing no T x S matrix: the backward recomputes
    each range's probabilities A and uses ``dD_ij = A_ij g_i (vw_j - hw_i)`` (the softmax's Jacobian applied
    to the rank-one gradient ``g vw^T`` of ``A``). Every row must have a key (no -inf-only row)."""

    @staticmethod
    def forward(ctx, q, k, vw, bias, bounds):
        hw = q.new_empty(q.shape[:-1], dtype=torch.float32)
        offset = k.size(2) - q.size(2)
        for s, e in bounds:
            a = _chunk_probs(q, k, bias, s, e)
            hw[:, :, s:e] = torch.matmul(a, vw[:, :, : offset + e, None].float()).squeeze(-1)
        ctx.save_for_backward(q, k, vw, bias, hw)
        ctx.bounds = bounds
        return hw.to(q.dtype)

    @staticmethod
    def backward(ctx, grad):
        q, k, vw, bias, hw = ctx.saved_tensors
        offset = k.size(2) - q.size(2)
        dq, dk, dvw = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(vw, dtype=torch.float32)
        grad = grad.float()
        for s, e in ctx.bounds:
            key_end = offset + e
            a = _chunk_probs(q, k, bias, s, e)  # (B, H, c, K)
            g = grad[:, :, s:e, None]  # (B, H, c, 1)
            dvw[:, :, :key_end] += torch.matmul(a.transpose(-1, -2), g).squeeze(-1)
            outer = torch.baddbmm((-g * hw[:, :, s:e, None]).flatten(0, 1), g.flatten(0, 1),
                                  vw[:, :, None, :key_end].float().flatten(0, 1))  # g_i (vw_j - hw_i)
            dd = a.mul_(outer.view_as(a)).to(q.dtype)
            del a, outer
            dq[:, :, s:e] = torch.matmul(dd, k[:, :, :key_end])
            dk[:, :, :key_end] += torch.matmul(dd.transpose(-1, -2), q[:, :, s:e])
        return dq, dk, dvw.to(vw.dtype), None, None


def first_pass_value_scores(q: Tensor, k: Tensor, vw: Tensor, allowed: Optional[Tensor],
                            use_sdpa: Optional[bool] = None, empty=COMPUTE, bounds=None) -> Tensor:
    """softmax(masked Q K^T) (V w_h), (B, H, T, 1), without dropout (the first pass has none); no T x S
    matrix is kept for the backward.

    On GPUs through SDPA with V w_h zero-padded to 8 columns (what the memory-efficient kernel accepts).
    On CPU SDPA's fused kernel needs V as wide as K (a narrow V falls back to its math path, which keeps
    the T x S matrix), so a custom autograd function computes it by query ranges (``bounds``, default
    ``query_chunks``) and recomputes the probabilities in its backward.
    """
    if use_sdpa is None:
        use_sdpa = q.device.type != "cpu"
    if empty is COMPUTE:
        empty = rows_without_keys(allowed)
    if use_sdpa:
        return safe_sdpa(q, k, F.pad(vw, (0, 7)), allowed, empty=empty)[..., :1]
    if empty is not None:  # rows without keys (left padding): the plain masked matrix
        first = masked_softmax(torch.matmul(q, k.transpose(-1, -2)), allowed, q.dtype, empty)
        return torch.matmul(first, vw)
    bias = None if allowed is None else blocked_bias(~allowed, torch.float32)
    if bounds is None:
        bounds = query_chunks(allowed, q.size(2), k.size(2))
    return _FirstPassValueScores.apply(q, k, vw.squeeze(-1), bias, bounds).unsqueeze(-1)


# ------------------------------------------------------------------------------------ both passes on CPU
def masked_column_starts(blocked1: Tensor, blocked2: Tensor, bounds):
    """``(s, e, c1, c2)`` per query range ``[s, e)``: the first key column with a masked entry in rows
    ``s .. e-1`` of ``blocked1`` / ``blocked2`` (``e`` if none), so that ``_BetSFCausal`` masks only the
    columns from there (under a causal mask the diagonal block). None unless every key masked in the first
    pass is masked in the second (``_BetSFCausal`` reuses the first pass's -inf), which DiagFreeMask keeps."""
    if bool((blocked1 & ~blocked2).any()):
        return None
    out = []
    for s, e in bounds:
        starts = []
        for blocked in (blocked1, blocked2):
            cols = blocked[..., s:e, :e].flatten(0, -2).any(0)
            starts.append(int(cols.int().argmax()) if bool(cols.any()) else e)
        out.append((s, e, *starts))
    return out


MASKED_LOGIT = -1e30  # a masked logit of ``_BetSFCausal``: finite, so that D * R never makes 0 * inf = NaN


def blocked_bias(blocked: Tensor, dtype, value: float = float("-inf")) -> Tensor:
    """An additive float mask, same shape: 0 where a key is allowed, ``value`` where ``blocked``. Adding it to a
    slice of logits is several times faster on CPU than ``masked_fill_`` with a broadcast boolean mask."""
    return torch.zeros(blocked.shape, dtype=dtype, device=blocked.device).masked_fill_(blocked, value)


class _BetSFCausal(torch.autograd.Function):
    """Both BET(SF) passes on one ``D = Q K^T`` per query range (``bounds``), storing no T x S matrix.

    Range ``[s, e)`` needs R only of the keys ``< e``, whose first passes are done by then, so one sweep
    computes ``A = softmax(D masked by blocked1)``, ``hw = A (V w_h)``, ``R = sigmoid(hw + kw)`` and
    ``out = softmax(D * R masked by blocked2) V`` (``blocked*``: boolean, True where a key is masked; kept
    for the backward as booleans, a quarter of a float mask). Masking adds ``MASKED_LOGIT`` (-1e30), not -inf:
    the forward reuses the first pass's masked D for the second, and a finite -1e30 times R stays finite when
    R underflows to 0; blocked2 covers blocked1, so every masked logit of either pass ends <= -1e30 beside a
    finite allowed one and its weight is exactly 0, as with -inf. ``A (V w_h)`` is an elementwise product and
    a row sum (a matrix-vector product through bmm is about 3 times slower on CPU). The backward sweeps the
    ranges in reverse (R_j's gradient comes from rows >= j), recomputing D and both softmaxes: the second
    pass's softmax gradient, ``dR_j = sum_i dD'_ij D_ij``, then the first pass's ``dD_ij += A_ij dz_i (vw_j -
    hw_i)`` with ``dz = dR R (1 - R)``. Needs T == S (query i is key i), float32, no dropout and no row without
    keys.
    """

    @staticmethod
    def forward(ctx, q, k, v, vw, kw, blocked1, blocked2, bounds):
        out = torch.empty_like(q)
        hw, r = q.new_empty(q.shape[:-1]), q.new_empty(q.shape[:-1])
        for s, e, c1, c2 in bounds:
            d = torch.matmul(q[:, :, s:e], k[:, :, :e].transpose(-1, -2))
            d[..., c1:e].add_(blocked_bias(blocked1[..., s:e, c1:e], d.dtype, MASKED_LOGIT))
            hw[:, :, s:e] = torch.softmax(d, dim=-1).mul_(vw[:, :, None, :e]).sum(-1)
            r[:, :, s:e] = torch.sigmoid(hw[:, :, s:e] + kw[:, :, s:e])
            d.mul_(r[:, :, None, :e])[..., c2:e].add_(blocked_bias(blocked2[..., s:e, c2:e], d.dtype, MASKED_LOGIT))
            out[:, :, s:e] = torch.matmul(torch.softmax(d, dim=-1), v[:, :, :e])
        ctx.save_for_backward(q, k, v, vw, hw, r, out, blocked1, blocked2)
        ctx.bounds = bounds
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, vw, hw, r, out, blocked1, blocked2 = ctx.saved_tensors
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dvw, dr = torch.zeros_like(vw), torch.zeros_like(vw)
        dz = torch.empty_like(vw)
        delta = (dout * out).sum(-1, keepdim=True)  # rowsum(dA' * A') of the second softmax
        for s, e, c1, c2 in reversed(ctx.bounds):
            d = torch.matmul(q[:, :, s:e], k[:, :, :e].transpose(-1, -2))
            p2 = d * r[:, :, None, :e]
            p2[..., c2:e].add_(blocked_bias(blocked2[..., s:e, c2:e], d.dtype, MASKED_LOGIT))
            p2 = torch.softmax(p2, dim=-1)
            dv[:, :, :e] += torch.matmul(p2.transpose(-1, -2), dout[:, :, s:e])
            dd = torch.matmul(dout[:, :, s:e], v[:, :, :e].transpose(-1, -2)).sub_(delta[:, :, s:e]).mul_(p2)
            del p2
            dr[:, :, :e] += (dd * d).sum(-2)
            dd.mul_(r[:, :, None, :e])
            rc = r[:, :, s:e]
            dz[:, :, s:e] = dr[:, :, s:e] * rc * (1 - rc)  # complete: rows >= s are done
            d[..., c1:e].add_(blocked_bias(blocked1[..., s:e, c1:e], d.dtype, MASKED_LOGIT))
            ag = torch.softmax(d, dim=-1).mul_(dz[:, :, s:e, None])  # A_ij dz_i
            del d
            dvw[:, :, :e] += ag.sum(-2)
            dd.addcmul_(ag, vw[:, :, None, :e]).addcmul_(ag, hw[:, :, s:e, None], value=-1.0)  # dz_i (vw_j - hw_i)
            del ag
            dq[:, :, s:e] = torch.matmul(dd, k[:, :, :e])
            dk[:, :, :e] += torch.matmul(dd.transpose(-1, -2), q[:, :, s:e])
        return dq, dk, dv, dvw, dz, None, None, None


def second_pass_masks(allowed: Tensor, keep_diagonal: bool, tgt_len: int, src_len: int):
    """``(rows without keys, the second pass's mask)`` of ``allowed``."""
    return (rows_without_keys(allowed),
            second_pass_allowed(allowed, keep_diagonal, tgt_len, src_len, allowed.device))


def kernel_masks(allowed: Tensor, keep_diagonal: bool, tgt_len: int, src_len: int):
    """``(blocked1, blocked2, bounds)`` for ``_BetSFCausal``, or None when ``allowed`` does not suit it: T != S (the
    kernel needs query i to be key i), a row without keys, or a key masked in the first pass but not in the second
    (``masked_column_starts``)."""
    empty, final_allowed = SECOND_PASS_MASKS(allowed, keep_diagonal, tgt_len, src_len)
    if empty is not None or tgt_len != src_len:
        return None
    blocked1, blocked2 = ~allowed, ~final_allowed
    bounds = masked_column_starts(blocked1, blocked2, query_chunks(allowed, tgt_len, src_len))
    return None if bounds is None else (blocked1, blocked2, bounds)


# Every layer of a forward sees the same mask: derive these once per mask.
SECOND_PASS_MASKS = LastMaskMemo(second_pass_masks)
KERNEL_MASKS = LastMaskMemo(kernel_masks)


def bet_sf_cpu_kernel(q: Tensor, k: Tensor, v: Tensor, w: Tensor, masks) -> Tensor:
    """BET(SF) through ``_BetSFCausal``; ``masks``: ``kernel_masks``'s (not None)."""
    w_h, w_k = split_bet_w(w, q.size(3), q.dtype)
    vw, kw = torch.matmul(v, w_h).squeeze(-1), torch.matmul(k, w_k).squeeze(-1)
    return _BetSFCausal.apply(q, k, v, vw, kw, *masks)


# ------------------------------------------------------------------------------------ SDPA
def bet_sf_causal_sdpa(q: Tensor, k: Tensor, v: Tensor, w: Tensor, keep_diagonal: bool = False,
                       dropout_p: float = 0.0) -> Tensor:
    """BET(SF) under the plain causal mask (T == S, no padding) with no mask tensor at all, so that
    memory stays linear in T (GPUs): the first pass is ``SDPA(Q, K, V w_h, is_causal)`` (V w_h padded to 8
    columns); the DiagFreeMask is the causal mask shifted by one key, query i >= 1 sees keys 0 .. i-1:
    ``SDPA(Q[1:], (R ⊙ K)[:-1], V[:-1], is_causal)``, and row 0 sees only itself (output V_0)."""
    w_h, w_k = split_bet_w(w, q.size(3), q.dtype)
    vw = F.pad(torch.matmul(v, w_h), (0, 7))
    hw = F.scaled_dot_product_attention(q, k, vw, is_causal=True, scale=1.0)[..., :1]
    kr = k * bet_key_scores(hw, k, w_k).unsqueeze(-1)
    if keep_diagonal or q.size(2) == 1:
        return F.scaled_dot_product_attention(q, kr, v, is_causal=True, dropout_p=dropout_p, scale=1.0)
    rest = F.scaled_dot_product_attention(q[:, :, 1:], kr[:, :, :-1], v[:, :, :-1], is_causal=True,
                                          dropout_p=dropout_p, scale=1.0)
    first_row = v[:, :, :1]
    if dropout_p > 0:  # row 0's single weight 1, dropped out like any other weight
        first_row = F.dropout(torch.ones_like(first_row[..., :1]), dropout_p) * first_row
    return torch.cat([first_row, rest], dim=2)


def bet_sf_folded_sdpa(q: Tensor, k: Tensor, v: Tensor, w: Tensor, allowed: Optional[Tensor],
                       keep_diagonal: bool = False, dropout_p: float = 0.0) -> Tensor:
    """BET(SF) with R folded into the keys, ``(Q K^T) * R = Q (R ⊙ K)^T`` column-wise: the second pass is one SDPA
    call after ``first_pass_value_scores``. Any mask (None: every key visible), dtype, device and dropout."""
    w_h, w_k = split_bet_w(w, q.size(3), q.dtype)
    if allowed is None:
        empty, final_allowed = None, second_pass_allowed(None, keep_diagonal, q.size(2), k.size(2), q.device)
    else:
        empty, final_allowed = SECOND_PASS_MASKS(allowed, keep_diagonal, q.size(2), k.size(2))
    hw = first_pass_value_scores(q, k, torch.matmul(v, w_h), allowed, empty=empty)
    r = bet_key_scores(hw, k, w_k)
    return safe_sdpa(q, k * r.unsqueeze(-1), v, final_allowed, dropout_p, empty)


def bet_authors_fused(q: Tensor, k: Tensor, v: Tensor, weight: Tensor, bias: Tensor, first_out_proj: Callable,
                      allowed: Tensor, keep_diagonal: bool = False, r_input: str = "key",
                      dropout_p: float = 0.0) -> Tensor:
    """``bet_authors_attention``'s output through two SDPA calls (the same math): the first pass is plain
    attention, the second folds R into the keys, ``(Q K^T) * R = Q (R ⊙ K)^T``. ``allowed`` may not be None."""
    first_out = safe_sdpa(q, k, v, allowed, dropout_p)
    r = bet_authors_r(q, k, first_out, weight, bias, first_out_proj, r_input)
    final_allowed = second_pass_allowed(allowed, keep_diagonal, q.size(2), k.size(2), q.device)
    return safe_sdpa(q, k * r.unsqueeze(-1), v, final_allowed, dropout_p)
