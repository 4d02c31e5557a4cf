"""BET's equations in plain PyTorch, written as the method states them (docs/method.md).

With ``D = Q K^T / sqrt(d)`` (``q`` always comes scaled by 1/sqrt(d)) and ``allowed`` the causal and padding mask:

- BET(SF) re-weighting (docs/method.md, "BET(SF) re-weighting"):
  first pass ``A = softmax(D)`` over the allowed keys, ``H = A V``;
  per key ``R_j = sigmoid(w . [H_j ; K_j]) = sigmoid(H_j w_h + K_j w_k)``;
  second pass ``A' = softmax(DiagFreeMask(D * R))``, where ``R_j`` scales column j of D; output ``A' V``.
  ``bet_sf_logits`` / ``bet_sf_attention`` compute exactly this, with both matrices materialised.
- The diagonal-free mask (docs/method.md, "diagonal-free mask"): each query loses its own key unless it is the
  only key it may see (``masks.diagonal_free``; ``second_pass_allowed`` here).
- The diagonal ablations (docs/method.md, "diagonal ablations"): ``scale_diagonal`` (Reduced / Magnified Diag);
  Diag-Free is ``masks.diagonal_free`` on plain attention.

Everything else computes the same numbers faster and lives apart: the fused kernels (``core/kernels.py``), one
decoding step (``core/decoding_step.py``), the choice between them (``core/paths.py``), the first author's code
form (``core/author_form.py``) and the baselines' score functions (``core/baselines.py``). The tests compare each of
them with these functions and with the float64 reference (tests/reference.py).
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from .masks import COMPUTE, diagonal_free, masked_softmax, own_position, rows_without_keys


# ------------------------------------------------------------------------------------ diagonal ablations
def scale_diagonal(logits: Tensor, scale: float) -> Tensor:
    """Reduced / Magnified Diag: each query's own logit ``D_ii`` times ``scale``. One query (a decoding step) is
    the last key's: its last logit, without building a mask."""
    if logits.size(-2) == 1:
        return torch.cat([logits[..., :-1], logits[..., -1:] * scale], dim=-1)
    diag = own_position(logits.size(-2), logits.size(-1), logits.device)
    return torch.where(diag, logits * scale, logits)


# ------------------------------------------------------------------------------------ BET(SF)
def split_bet_w(w: Tensor, head_dim: int, dtype=None) -> Tuple[Tensor, Tensor]:
    """w (heads or 1, 2 d) -> ``(w_h, w_k)``, its H part and its K part, each (heads or 1, d, 1)."""
    w = w if dtype is None else w.to(dtype)
    return w[:, :head_dim].unsqueeze(-1), w[:, head_dim:].unsqueeze(-1)


def bet_key_scores(first_probs_times_vw: Tensor, k_new: Tensor, w_k: Tensor) -> Tensor:
    """R_j = sigmoid(H_j w_h + K_j w_k), (B, H, T), given H w_h = A (V w_h) as (B, H, T, 1).

    H enters R only through ``H w_h = A (V w_h)``, so H itself (T x d per head) is never formed.
    """
    return torch.sigmoid(first_probs_times_vw + torch.matmul(k_new, w_k)).squeeze(-1)


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


# ------------------------------------------------------------------------------------ head layout
def merge_heads(x: Tensor) -> Tensor:
    """(B, H, T, d) -> (B, T, H * d): head h in columns h * d .. (h + 1) * d - 1 (fairseq's layout)."""
    return x.transpose(1, 2).reshape(x.size(0), x.size(2), x.size(1) * x.size(3))


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """(B, T, E) -> (B, H, T, E / H), the inverse of ``merge_heads``."""
    return x.view(x.size(0), x.size(1), num_heads, x.size(2) // num_heads).transpose(1, 2)
