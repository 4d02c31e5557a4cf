"""One decoding step of BET(SF): one query that sees every cached key (beam search and sampling: one token, no
padding), the same numbers as the full pass (``core/functional.py``, ``core/author_form.py``) within rounding.

Two matrix products make q (scaled) and, per head, ``k | v | what R needs of the new key``, with weights derived
from the module's once per generation (``*_step_projection``): every piece is a view that the next operator takes
as it is. No mask is built: the step's own key is the last, so the DiagFreeMask drops the last column. R and
``V w_h`` of the earlier keys come from the cache (they never change once computed), so the step adds to plain
attention only R of the new key and the second softmax. q keeps a product of its own: on CPU one product for q
and the keys' columns together was slower with a few hundred hypotheses (docs/performance.md).
"""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor


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
