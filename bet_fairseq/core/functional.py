"""The score functions of each attention variant (plain PyTorch; see the package docstring).

``q`` always comes scaled by 1/sqrt(head_dim) unless a function says otherwise.
"""

from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .masks import (COMPUTE, LastMaskMemo, causal_allowed, diagonal_free, masked_softmax,
                    own_position, rows_without_keys, safe_sdpa, tracing)


# ------------------------------------------------------------------------------------ diagonal
def scale_diagonal(logits: Tensor, scale: float) -> Tensor:
    """Reduced / Magnified Diag: each query's own logit ``D_ii`` times ``scale``. One query (a decoding step) is
    the last key's: its last logit, without building a mask."""
    if logits.size(-2) == 1:
        return torch.cat([logits[..., :-1], logits[..., -1:] * scale], dim=-1)
    diag = own_position(logits.size(-2), logits.size(-1), logits.device)
    return torch.where(diag, logits * scale, logits)


# ------------------------------------------------------------------------------------ BET(SF)
def bet_key_scores(first_probs_times_vw: Tensor, k_new: Tensor, w_k: Tensor) -> Tensor:
    """R_j = sigmoid(H_j w_h + K_j w_k), (B, H, T), given H w_h = A (V w_h) as (B, H, T, 1).

    H enters R only through ``H w_h = A (V w_h)``, so H itself (T x d per head) is never formed.
    """
    return torch.sigmoid(first_probs_times_vw + torch.matmul(k_new, w_k)).squeeze(-1)


def split_bet_w(w: Tensor, head_dim: int, dtype=None) -> Tuple[Tensor, Tensor]:
    """w (heads or 1, 2 d) -> its H part and its K part, each (heads or 1, d, 1)."""
    w = w if dtype is None else w.to(dtype)
    return w[:, :head_dim].unsqueeze(-1), w[:, head_dim:].unsqueeze(-1)


def bet_sf_logits(q: Tensor, k: Tensor, v: Tensor, w: Tensor, allowed: Optional[Tensor],
                  keep_diagonal: bool = False, prev_r: Optional[Tensor] = None, prev_vw: Optional[Tensor] = None,
                  empty=COMPUTE):
    """BET(SF) up to the second softmax: ``(D * R, the second pass's mask, A, R, V w_h)``.

    First pass ``A = softmax(D)`` (no dropout), ``R_j = sigmoid(w . [H_j ; K_j])`` with ``H = A V``; the
    second pass's mask is DiagFreeMask(allowed) (``keep_diagonal``: allowed). ``prev_r`` / ``prev_vw``: R and
    ``V w_h`` of the first S - T keys, cached by an incremental decoder (they never change once computed).
    ``allowed=None``: every key visible. R and ``V w_h`` are returned for all S keys. ``empty``:
    ``rows_without_keys(allowed)`` if the caller has it (the second pass has the same empty rows).
    """
    tgt_len, src_len, head_dim = q.size(2), k.size(2), q.size(3)
    scores = torch.matmul(q, k.transpose(-1, -2))  # D = Q K^T / sqrt(d)
    first = masked_softmax(scores, allowed, q.dtype, empty)
    new = src_len - tgt_len
    w_h, w_k = split_bet_w(w, head_dim, q.dtype)
    if prev_vw is None or prev_vw.size(2) != new:
        vw = torch.matmul(v, w_h).squeeze(-1)  # (B, H, S)
    else:
        vw = torch.cat([prev_vw, torch.matmul(v[:, :, new:], w_h).squeeze(-1)], dim=2)
    r_new = bet_key_scores(torch.matmul(first, vw.unsqueeze(-1)), k[:, :, new:], w_k)
    r = r_new if prev_r is None else torch.cat([prev_r, r_new], dim=2)
    final_allowed = second_pass_allowed(allowed, keep_diagonal, tgt_len, src_len, q.device)
    return scores * r.unsqueeze(2), final_allowed, first, r, vw  # R_j scales column j


def second_pass_allowed(allowed: Optional[Tensor], keep_diagonal: bool, tgt_len: int, src_len: int,
                        device=None) -> Optional[Tensor]:
    """The mask of BET's second softmax: DiagFreeMask(allowed), or ``allowed`` itself with ``keep_diagonal``.
    ``allowed=None`` (one decoding step that sees every key): the own (last) key goes unless it is the only one.
    A row has a key here exactly when it has one in ``allowed`` (DiagFreeMask keeps a lone diagonal)."""
    if allowed is None:
        if not keep_diagonal and src_len > 1:
            final_allowed = torch.ones(1, 1, tgt_len, src_len, dtype=torch.bool, device=device)
            final_allowed[..., -1] = False
            return final_allowed
        return None
    return allowed if keep_diagonal else diagonal_free(allowed)


# One decoding step (one query that sees every key: no padding), the path of beam search and sampling. Two matrix
# products make q (scaled) and, per head, ``k | v | what R needs of the new key``, with weights derived from the
# module's (``*_step_projection``, remembered while the weights are unchanged): every piece is a view that the
# next operator takes as it is, and no mask is built (the own key is the last). q keeps its own product: on CPU
# one product for all of them was slower at 250 hypotheses (docs/performance.md, "Fifth round").
def head_dot_rows(weight: Tensor, bias: Optional[Tensor], w: Tensor, heads: int) -> Tuple[Tensor, Tensor]:
    """The linear map ``x -> (x W^T + b)_h . w_h`` per head as rows (heads, E) and a bias (heads,), for ``weight``
    (heads * d, E) and ``w`` (heads or 1, d)."""
    d = weight.size(0) // heads
    rows = (weight.view(heads, d, -1) * w.view(-1, d, 1)).sum(1)
    return rows, (rows.new_zeros(heads) if bias is None else (bias.view(heads, d) * w.view(-1, d)).sum(-1))


def per_head_blocks(parts, heads: int) -> Tuple[Tensor, Tensor]:
    """One projection from several, ``parts`` = [(weight (heads * n_i, E), bias or None)], its rows grouped by
    head (head 0's n_0 + n_1 + ... rows, then head 1's ...): the output viewed as (B, heads, 1, sum n_i) splits
    into per-head pieces by slicing the last dimension."""
    weights = [w.view(heads, -1, w.size(-1)) for w, _ in parts]
    biases = [w.new_zeros(w.shape[:2]) if b is None else b.view(heads, -1) for w, (_, b) in zip(weights, parts)]
    return torch.cat(weights, dim=1).flatten(0, 1), torch.cat(biases, dim=1).flatten()


def scaled(weight: Tensor, bias: Optional[Tensor], scaling: float):
    """A linear map's (weight, bias) times ``scaling``."""
    return weight * scaling, None if bias is None else bias * scaling


def bet_sf_step_projection(q_proj, k_proj, v_proj, w: Tensor, scaling: float, heads: int):
    """``(q weight, q bias, kv weight, kv bias)`` of the equations form's step: q scaled; per head
    ``[k | v | V w_h | K w_k]`` (2 d + 2 rows). ``*_proj``: (weight, bias) pairs; ``w`` (heads or 1, 2 d)."""
    d = q_proj[0].size(0) // heads
    return (*scaled(*q_proj, scaling), *per_head_blocks(
        [k_proj, v_proj, head_dot_rows(*v_proj, w[:, :d], heads), head_dot_rows(*k_proj, w[:, d:], heads)], heads))


def bet_sf_step(q: Tensor, k: Tensor, v: Tensor, vw_new: Tensor, kw_new: Tensor, prev_r: Tensor, prev_vw: Tensor,
                keep_diagonal: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """``bet_sf_attention``'s output for one query that sees all S keys (the new key last), with R and V w_h of the
    S - 1 earlier keys cached: ``(out (B, H, 1, d), R, V w_h of all S keys (B, H, S))``. ``vw_new``, ``kw_new``:
    ``V w_h`` and ``K w_k`` of the new key, (B, H, 1). ``R_new = sigmoid(A (V w_h) + K w_k)`` is one ``baddbmm``."""
    batch, heads, src_len = k.shape[:3]
    scores = torch.matmul(q, k.transpose(-1, -2))  # (B, H, 1, S)
    vw = torch.cat([prev_vw, vw_new], dim=2)
    first = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    r_logit = torch.baddbmm(kw_new.reshape(batch * heads, 1, 1), first.view(batch * heads, 1, src_len),
                            vw.view(batch * heads, src_len, 1))
    r = torch.cat([prev_r, torch.sigmoid(r_logit).view(batch, heads, 1)], dim=2)
    return second_pass_step(scores, prev_r, r, v, keep_diagonal), r, vw


def second_pass_step(scores: Tensor, prev_r: Tensor, r: Tensor, v: Tensor, keep_diagonal: bool) -> Tensor:
    """``softmax(DiagFreeMask(D * R)) V`` of one step that sees every key. The DiagFreeMask drops the own key, the
    last, unless it is the only one: then the step uses the first S - 1 keys, whose R is cached (no mask)."""
    if keep_diagonal or scores.size(-1) == 1:
        logits, values = scores * r.unsqueeze(2), v
    else:
        logits, values = scores[..., :-1] * prev_r.unsqueeze(2), v[:, :, :-1]
    return torch.matmul(F.softmax(logits, dim=-1, dtype=torch.float32).to(v.dtype), values)


def bet_sf_attention(q: Tensor, k: Tensor, v: Tensor, w: Tensor, allowed: Optional[Tensor],
                     keep_diagonal: bool = False, dropout=None, prev_r: Optional[Tensor] = None,
                     prev_vw: Optional[Tensor] = None):
    """BET(SF) with the attention matrix materialised: ``A' = softmax(DiagFreeMask(D * R))``, output
    ``A' V`` (``dropout`` on A'). Returns ``(out, A', A, R of all S keys, V w_h of all S keys)``; the
    arguments are those of ``bet_sf_logits``."""
    empty = rows_without_keys(allowed)
    logits, final_allowed, first, r, vw = bet_sf_logits(q, k, v, w, allowed, keep_diagonal, prev_r, prev_vw, empty)
    probs = masked_softmax(logits, final_allowed, q.dtype, empty)
    out = torch.matmul(probs if dropout is None else dropout(probs), v)
    return out, probs, first, r, vw


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


def bet_sf_fused(q: Tensor, k: Tensor, v: Tensor, w: Tensor, allowed: Tensor, keep_diagonal: bool = False,
                 dropout_p: float = 0.0) -> Tensor:
    """BET(SF) without keeping A' or A for the backward. On CPU (float32, no attention dropout, no row without
    keys, T == S) both passes run in ``_BetSFCausal`` on one ``Q K^T`` per query range; on GPUs under the plain
    causal mask ``bet_sf_causal_sdpa`` (no mask tensor); otherwise R is folded into the keys,
    ``(Q K^T) * R = Q (R ⊙ K)^T`` column-wise, and the second pass is one SDPA call after
    ``first_pass_value_scores``."""
    w_h, w_k = split_bet_w(w, q.size(3), q.dtype)
    cpu_kernel = q.device.type == "cpu" and dropout_p == 0.0 and q.dtype == torch.float32
    if allowed is None:
        empty, final_allowed, kernel_masks = None, second_pass_allowed(None, keep_diagonal, q.size(2), k.size(2),
                                                                        q.device), None
    else:
        empty, final_allowed, kernel_masks = FUSED_MASKS(allowed, keep_diagonal, q.size(2), k.size(2), cpu_kernel)
    if cpu_kernel and kernel_masks is not None:
        vw, kw = torch.matmul(v, w_h).squeeze(-1), torch.matmul(k, w_k).squeeze(-1)
        return _BetSFCausal.apply(q, k, v, vw, kw, *kernel_masks)
    if (q.device.type != "cpu" and allowed is not None and allowed.size(0) == 1 and q.size(2) == k.size(2)
            and not tracing() and torch.equal(allowed, causal_allowed(q.size(2), k.size(2), q.device))):
        return bet_sf_causal_sdpa(q, k, v, w, keep_diagonal, dropout_p)
    hw = first_pass_value_scores(q, k, torch.matmul(v, w_h), allowed, empty=empty)
    r = bet_key_scores(hw, k, w_k)
    return safe_sdpa(q, k * r.unsqueeze(-1), v, final_allowed, dropout_p, empty)


def fused_masks(allowed: Tensor, keep_diagonal: bool, tgt_len: int, src_len: int, cpu_kernel: bool):
    """What ``bet_sf_fused`` derives from its mask: ``(rows without keys, the second pass's mask, kernel masks)``,
    the last ``(blocked1, blocked2, bounds)`` for ``_BetSFCausal`` when ``cpu_kernel`` and the mask suits it
    (T == S, no row without keys, ranges found by ``masked_column_starts``), else None."""
    empty = rows_without_keys(allowed)
    final_allowed = second_pass_allowed(allowed, keep_diagonal, tgt_len, src_len, allowed.device)
    if not cpu_kernel or empty is not None or tgt_len != src_len:
        return empty, final_allowed, None
    blocked1, blocked2 = ~allowed, ~final_allowed
    bounds = masked_column_starts(blocked1, blocked2, query_chunks(allowed, tgt_len, src_len))
    return empty, final_allowed, None if bounds is None else (blocked1, blocked2, bounds)


FUSED_MASKS = LastMaskMemo(fused_masks)  # every layer of a forward sees the same mask


def bet_sf_causal_sdpa(q: Tensor, k: Tensor, v: Tensor, w: Tensor, keep_diagonal: bool = False,
                       dropout_p: float = 0.0) -> Tensor:
    """``bet_sf_fused`` under the plain causal mask (T == S, no padding) with no mask tensor at all, so that
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


# ------------------------------------------------------------------------------------ BET(SF), the authors' code
# The first author's public code (README: "The authors' BET(SF)"): one Linear(2 d, 1) with a bias per layer, shared
# by the heads, fed with [K_j ; H_j] (the fairseq fork) or [Q_j / sqrt(d) ; H_j] (the LM repository), where H is the
# first pass's output AFTER the output projection, split back into heads; a second output projection follows.
BET_R_INPUTS = ("key", "query")


def merge_heads(x: Tensor) -> Tensor:
    """(B, H, T, d) -> (B, T, H * d): head h in columns h * d .. (h + 1) * d - 1 (fairseq's layout)."""
    return x.transpose(1, 2).reshape(x.size(0), x.size(2), x.size(1) * x.size(3))


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """(B, T, E) -> (B, H, T, E / H), the inverse of ``merge_heads``."""
    return x.view(x.size(0), x.size(1), num_heads, x.size(2) // num_heads).transpose(1, 2)


def bet_authors_key_scores(x: Tensor, h: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """The authors' ``R = sigmoid(W [x ; h] + b)``, (B, H, T), with one ``Linear(2 d, 1)`` (``weight`` (1, 2 d),
    ``bias`` (1,)) for every head; ``x`` and ``h`` are (B, H, T, d)."""
    cat = torch.cat([x, h.to(x.dtype)], dim=-1)
    return torch.sigmoid(F.linear(cat, weight.to(cat.dtype), bias.to(cat.dtype))).squeeze(-1)


def bet_authors_r(q: Tensor, k: Tensor, first_out: Tensor, weight: Tensor, bias: Tensor, first_out_proj: Callable,
                  r_input: str = "key", prev_r: Optional[Tensor] = None) -> Tensor:
    """R of all S keys, (B, H, S): ``prev_r`` (the first S - T, cached by an incremental decoder: R of a key never
    changes) and R of the T new keys from their first-pass output ``first_out`` = A V (B, H, T, d):
    ``H = split(first_out_proj(merge(A V)))``, then ``sigmoid(W [K ; H] + b)`` (``r_input="key"``) or
    ``sigmoid(W [Q ; H] + b)`` with the scaled Q (``"query"``). ``first_out_proj`` maps (B, T, E) -> (B, T, E).
    """
    if r_input not in BET_R_INPUTS:
        raise ValueError(f"r_input must be one of {BET_R_INPUTS}, got {r_input!r}")
    tgt_len, src_len = q.size(2), k.size(2)
    new = src_len - tgt_len
    if (0 if prev_r is None else prev_r.size(2)) != new:
        raise ValueError(f"R of the {new} keys before the {tgt_len} queries is needed (prev_r), got "
                         f"{None if prev_r is None else prev_r.size(2)}")
    h = split_heads(first_out_proj(merge_heads(first_out)), q.size(1))
    r_new = bet_authors_key_scores(k[:, :, new:] if r_input == "key" else q, h, weight, bias)
    return r_new if prev_r is None else torch.cat([prev_r, r_new], dim=2)


def bet_authors_logits(q: Tensor, k: Tensor, v: Tensor, weight: Tensor, bias: Tensor, first_out_proj: Callable,
                       allowed: Optional[Tensor], keep_diagonal: bool = False, r_input: str = "key", dropout=None,
                       prev_r: Optional[Tensor] = None):
    """The authors' BET(SF) up to the second softmax: ``(D * R, the second pass's mask, A, R of all S keys)``.

    First pass ``A = softmax(D)`` with ``dropout`` on A before ``A V`` (as that code does); R as ``bet_authors_r``;
    R_j scales column j of the unmasked ``D = Q K^T / sqrt(d)`` and the mask is applied afterwards (the same
    numbers as masking first: masked logits are -inf either way), DiagFreeMask unless ``keep_diagonal``.
    """
    scores = torch.matmul(q, k.transpose(-1, -2))
    first = masked_softmax(scores, allowed, q.dtype)
    first_out = torch.matmul(first if dropout is None else dropout(first), v)
    r = bet_authors_r(q, k, first_out, weight, bias, first_out_proj, r_input, prev_r)
    final_allowed = second_pass_allowed(allowed, keep_diagonal, q.size(2), k.size(2), q.device)
    return scores * r.unsqueeze(2), final_allowed, first, r


def bet_authors_attention(q: Tensor, k: Tensor, v: Tensor, weight: Tensor, bias: Tensor, first_out_proj: Callable,
                          allowed: Optional[Tensor], keep_diagonal: bool = False, r_input: str = "key", dropout=None,
                          prev_r: Optional[Tensor] = None):
    """The authors' BET(SF) with A' materialised: ``(out, A', A, R of all S keys)``, ``out = dropout(A') V``
    (B, H, T, d) BEFORE the second output projection (the caller's); arguments as ``bet_authors_logits``."""
    logits, final_allowed, first, r = bet_authors_logits(q, k, v, weight, bias, first_out_proj, allowed,
                                                         keep_diagonal, r_input, dropout, prev_r)
    probs = masked_softmax(logits, final_allowed, q.dtype)
    return torch.matmul(probs if dropout is None else dropout(probs), v), probs, first, r


def bet_authors_fused(q: Tensor, k: Tensor, v: Tensor, weight: Tensor, bias: Tensor, first_out_proj: Callable,
                      allowed: Tensor, keep_diagonal: bool = False, r_input: str = "key",
                      dropout_p: float = 0.0) -> Tensor:
    """``bet_authors_attention``'s output through two SDPA calls (the same math): the first pass is plain
    attention, the second folds R into the keys, ``(Q K^T) * R = Q (R ⊙ K)^T``. ``allowed`` may not be None."""
    first_out = safe_sdpa(q, k, v, allowed, dropout_p)
    r = bet_authors_r(q, k, first_out, weight, bias, first_out_proj, r_input)
    final_allowed = second_pass_allowed(allowed, keep_diagonal, q.size(2), k.size(2), q.device)
    return safe_sdpa(q, k * r.unsqueeze(-1), v, final_allowed, dropout_p)


def bet_authors_step_projection(q_proj, k_proj, v_proj, out_proj, weight: Tensor, bias: Tensor, scaling: float,
                                heads: int, r_input: str = "key"):
    """``(q weight, q bias, kv weight, kv bias, g)`` of the authors' forms' step: q scaled; per head
    ``[k | v | x w_x + c]`` (2 d + 1 rows); ``g`` (E, heads): R's logit is ``W [x ; H] + b = x w_x + H w_H + b`` with
    ``H = out_proj(merge(A V))``, so ``H_h w_H = merge(A V) g_h + b_out,h w_H``; ``x`` is K (``r_input="key"``) or
    the scaled Q, ``c`` gathers the constants. ``*_proj``: (weight, bias) pairs; ``weight`` (1, 2 d), ``bias``
    (1,) of the shared Linear."""
    d = q_proj[0].size(0) // heads
    q_scaled = scaled(*q_proj, scaling)
    x_rows, x_bias = head_dot_rows(*(k_proj if r_input == "key" else q_scaled), weight[:, :d], heads)
    g_rows, g_bias = head_dot_rows(*out_proj, weight[:, d:], heads)
    return (*q_scaled, *per_head_blocks([k_proj, v_proj, (x_rows, x_bias + g_bias + bias)], heads), g_rows.t())


def bet_authors_step(q: Tensor, k: Tensor, v: Tensor, xw_new: Tensor, g: Tensor, prev_r: Tensor,
                     keep_diagonal: bool = False) -> Tuple[Tensor, Tensor]:
    """``bet_authors_attention``'s output (before the second output projection) for one query that sees all S
    keys, with R of the S - 1 earlier keys cached, and no dropout: ``(out (B, H, 1, d), R of all S keys)``.
    ``xw_new`` (B, H) and ``g``: ``bet_authors_step_projection``'s; R's logit is one ``addmm``."""
    scores = torch.matmul(q, k.transpose(-1, -2))  # (B, H, 1, S)
    first_out = torch.matmul(F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)  # (B, H, 1, d)
    r_logit = torch.addmm(xw_new, first_out.view(first_out.size(0), -1), g)  # (B, H)
    r = torch.cat([prev_r, torch.sigmoid(r_logit).unsqueeze(-1)], dim=2)
    return second_pass_step(scores, prev_r, r, v, keep_diagonal), r


# ------------------------------------------------------------------------------------ baselines
def top_k_keep(logits: Tensor, allowed: Optional[Tensor], k: int) -> Tensor:
    """Zhao et al. 2019: the logits each row keeps: allowed and >= the row's k-th largest allowed
    logit (ties all kept); every allowed entry when a row has fewer than k."""
    masked = logits if allowed is None else logits.masked_fill(~allowed, float("-inf"))
    kk = min(k, masked.size(-1))
    kth = masked.topk(kk, dim=-1).values[..., -1:]  # -inf when fewer than k are allowed
    keep = masked >= kth
    return keep if allowed is None else keep & allowed


def localness_bias(centre: Tensor, width: Tensor, src_len: int, min_sigma: float = 1e-4) -> Tensor:
    """Yang et al. 2018: Gaussian bias ``-(j - P_i)^2 / (2 sigma_i^2)``, sigma = D / 2, (B, 1, T, S),
    in float32 (in half precision the bias of a narrow window would overflow to -inf)."""
    centre, width = centre.float(), width.float()
    sigma = (width / 2).clamp_min(min_sigma)
    keys = torch.arange(src_len, device=centre.device, dtype=torch.float32)
    bias = -((keys.view(1, 1, -1) - centre.unsqueeze(-1)) ** 2) / (2 * sigma.unsqueeze(-1) ** 2)
    return bias.unsqueeze(1)


def hopfield_logits(xi: Tensor, k: Tensor, beta: float, steps: Optional[int], allowed: Optional[Tensor],
                    eps: Optional[float] = None) -> Tensor:
    """Ramsauer et al. 2020: ``steps - 1`` updates ``xi <- softmax(beta xi K^T) K`` of the (unscaled)
    state patterns, then the final logits ``beta xi K^T``.

    ``eps`` (the hopfield-layers library's ``update_steps_eps``): a query row stops updating once its
    association row changed by at most ``eps`` (L2) in an update, and keeps the logits of that update;
    ``steps`` is then a maximum (None: none). The decision is per (batch, head, query) row, so a row never
    depends on another row (causal, and a decoding step equals the full pass); the library decides per
    head over the whole batch.
    """
    kt = k.transpose(-1, -2)
    logits = beta * torch.matmul(xi, kt)
    if eps is None or steps == 1:
        for _ in range(steps - 1):
            xi = torch.matmul(masked_softmax(logits, allowed, xi.dtype), k)
            logits = beta * torch.matmul(xi, kt)
        return logits
    probs = masked_softmax(logits, allowed, torch.float32)
    active = torch.ones(logits.shape[:-1], dtype=torch.bool, device=logits.device)
    step = 1
    while (steps is None or step < steps) and bool(active.any()):
        new_logits = beta * torch.matmul(torch.matmul(probs.to(k.dtype), k), kt)
        new_probs = masked_softmax(new_logits, allowed, torch.float32)
        rows = active.unsqueeze(-1)
        logits = torch.where(rows, new_logits, logits)
        with torch.no_grad():
            active = active & ((new_probs - probs).norm(dim=-1) > eps)
        probs = torch.where(rows, new_probs, probs)
        step += 1
    return logits


def relative_sinusoids(length: int, dim: int, device=None, dtype=torch.float) -> Tensor:
    """Transformer-XL's R_d for the distances d = 0 .. length-1: (length, dim), [sin ; cos]."""
    if dim % 2:
        raise ValueError(f"the relative sinusoid needs an even model dimension, got {dim}")
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=device, dtype=torch.float) / dim))
    angles = torch.arange(length, device=device, dtype=torch.float).unsqueeze(1) * inv_freq
    return torch.cat([angles.sin(), angles.cos()], dim=-1).to(dtype)


def relative_logits(q: Tensor, k: Tensor, r: Tensor, u: Tensor, v: Tensor, clamp_len: Optional[int] = None) -> Tensor:
    """Transformer-XL (Dai et al. 2019, 3.3): ``(q_i + u)^T k_j + (q_i + v)^T r_{i-j}``.

    q (B, H, T, d), k (B, H, S, d) with the queries at the last T positions; r (H, R, d) the projected
    sinusoids of the distances 0 .. R-1 (R = S, or clamp_len + 1 when that is fewer); u, v (H, d). The distance term is computed once per distance
    and gathered into the (i, j) grid (the same numbers as the paper's relative shift). Distances < 0
    (future keys) read distance 0; the causal mask removes them. ``clamp_len``: distances beyond it read
    ``r`` of ``clamp_len`` (the reference code's ``clamp_len``).
    """
    tgt_len, src_len = q.size(2), k.size(2)
    content = torch.matmul(q + u.unsqueeze(1), k.transpose(-1, -2))
    by_distance = torch.matmul(q + v.unsqueeze(1), r.transpose(-1, -2))  # (B, H, T, distance)
    qpos = torch.arange(src_len - tgt_len, src_len, device=q.device).unsqueeze(1)
    distance = (qpos - torch.arange(src_len, device=q.device).unsqueeze(0)).clamp(min=0, max=clamp_len)
    return content + by_distance.gather(-1, distance.expand(q.size(0), q.size(1), -1, -1))


def routing_vectors(x: Tensor) -> Tensor:
    """Routing Transformer: layer-normalise (no affine) and unit-normalise (at least float32)."""
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    return F.normalize(F.layer_norm(x, x.shape[-1:]), dim=-1)


def nearest_centroid(x: Tensor, centroids: Tensor) -> Tensor:
    """x (B, H, L, d) unit vectors, centroids (H, C, d) -> cluster index (B, H, L)."""
    return torch.einsum("bhld,hcd->bhlc", x, centroids.to(x.dtype)).argmax(dim=-1)


def routing_commitment(r: Tensor, centroids: Tensor, keep: Optional[Tensor] = None) -> Tensor:
    """Roy et al.'s k-means commitment term of each token, ``mean_h ||r_h - mu(r_h)||^2``, (B, L).

    r (B, H, L, d) routing vectors, centroids (H, C, d), mu(r) the nearest centroid (a constant: the
    term pulls the vectors towards their centroids, never the centroids); ``keep`` (B, L) zeroes padding.
    With unit vectors this is the reference code's mean of ``(LN(x) - mu)^2`` over the dimensions, whose
    layer-normalised vectors have norm sqrt(d)."""
    idx = nearest_centroid(r.detach(), centroids)
    heads = torch.arange(r.size(1), device=r.device).view(1, -1, 1)
    mu = centroids.to(r.dtype)[heads, idx]  # (B, H, L, d)
    per_token = (r - mu).square().sum(-1).mean(1)
    return per_token if keep is None else per_token * keep.to(per_token.dtype)


class _CommitmentGradient(torch.autograd.Function):
    """Identity forward; backward adds the gradient of ``weight * sum of routing_commitment`` over the
    routing heads ``x[:, first_head:]`` (routing vectors of ``x / divisor``). fairseq's criterions sum
    the loss over tokens and the trainer divides the gradients by the sample size (tokens), so a
    per-token sum here becomes the reference code's per-token mean; the reported loss stays the
    criterion's own (perplexity is not changed)."""

    @staticmethod
    def forward(ctx, x, centroids, keep, weight, first_head, divisor):
        ctx.save_for_backward(x, centroids, keep)
        ctx.weight, ctx.first_head, ctx.divisor = weight, first_head, divisor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        x, centroids, keep = ctx.saved_tensors
        with torch.enable_grad():
            xr = x[:, ctx.first_head:].detach().requires_grad_()
            loss = ctx.weight * routing_commitment(routing_vectors(xr / ctx.divisor), centroids, keep).sum()
            (extra,) = torch.autograd.grad(loss, xr)
        grad = grad.clone()
        grad[:, ctx.first_head:] += extra.to(grad.dtype)
        return grad, None, None, None, None, None


def with_commitment_gradient(x: Tensor, centroids: Tensor, keep: Optional[Tensor], weight: float,
                             first_head: int = 0, divisor: float = 1.0) -> Tensor:
    """``x`` (B, H, L, d) unchanged, whose gradient gains that of ``weight * routing_commitment`` summed
    over the tokens, for the heads from ``first_head`` (see ``_CommitmentGradient``). ``centroids``:
    the ones the forward routed with (pass a copy if they change before the backward)."""
    return _CommitmentGradient.apply(x, centroids, keep, float(weight), int(first_head), float(divisor))
