"""The score functions of each attention variant (plain PyTorch; see the package docstring).

``q`` always comes scaled by 1/sqrt(head_dim) unless a function says otherwise.
"""

from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .masks import diagonal_free, masked_softmax, own_position, safe_sdpa


# ------------------------------------------------------------------------------------ diagonal
def scale_diagonal(logits: Tensor, scale: float) -> Tensor:
    """Reduced / Magnified Diag: each query's own logit ``D_ii`` times ``scale``."""
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
                  keep_diagonal: bool = False, prev_r: Optional[Tensor] = None, prev_vw: Optional[Tensor] = None):
    """BET(SF) up to the second softmax: ``(D * R, the second pass's mask, A, R, V w_h)``.

    First pass ``A = softmax(D)`` (no dropout), ``R_j = sigmoid(w . [H_j ; K_j])`` with ``H = A V``; the
    second pass's mask is DiagFreeMask(allowed) (``keep_diagonal``: allowed). ``prev_r`` / ``prev_vw``: R and
    ``V w_h`` of the first S - T keys, cached by an incremental decoder (they never change once computed).
    ``allowed=None``: every key visible. R and ``V w_h`` are returned for all S keys.
    """
    tgt_len, src_len, head_dim = q.size(2), k.size(2), q.size(3)
    scores = torch.matmul(q, k.transpose(-1, -2))  # D = Q K^T / sqrt(d)
    first = masked_softmax(scores, allowed, q.dtype)
    w_h, w_k = split_bet_w(w, head_dim, q.dtype)
    new = src_len - tgt_len
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
    ``allowed=None`` (one decoding step that sees every key): the own (last) key goes unless it is the only one."""
    if allowed is None:
        if not keep_diagonal and src_len > 1:
            final_allowed = torch.ones(1, 1, tgt_len, src_len, dtype=torch.bool, device=device)
            final_allowed[..., -1] = False
            return final_allowed
        return None
    return allowed if keep_diagonal else diagonal_free(allowed)


def bet_sf_attention(q: Tensor, k: Tensor, v: Tensor, w: Tensor, allowed: Optional[Tensor],
                     keep_diagonal: bool = False, dropout=None, prev_r: Optional[Tensor] = None,
                     prev_vw: Optional[Tensor] = None):
    """BET(SF) with the attention matrix materialised: ``A' = softmax(DiagFreeMask(D * R))``, output
    ``A' V`` (``dropout`` on A'). Returns ``(out, A', A, R of all S keys, V w_h of all S keys)``; the
    arguments are those of ``bet_sf_logits``."""
    logits, final_allowed, first, r, vw = bet_sf_logits(q, k, v, w, allowed, keep_diagonal, prev_r, prev_vw)
    probs = masked_softmax(logits, final_allowed, q.dtype)
    out = torch.matmul(probs if dropout is None else dropout(probs), v)
    return out, probs, first, r, vw


def first_pass_value_scores(q: Tensor, k: Tensor, vw: Tensor, allowed: Optional[Tensor],
                            use_sdpa: Optional[bool] = None) -> Tensor:
    """softmax(masked Q K^T) (V w_h), (B, H, T, 1), without dropout (the first pass has none).

    On GPUs through SDPA with V w_h zero-padded to 8 columns (what the memory-efficient kernel
    accepts), so no T x S matrix is stored; on CPU SDPA would fall back to its math path with extra
    copies, so the matrix is computed directly there.
    """
    if use_sdpa is None:
        use_sdpa = q.device.type != "cpu"
    if use_sdpa:
        return safe_sdpa(q, k, F.pad(vw, (0, 7)), allowed)[..., :1]
    first = masked_softmax(torch.matmul(q, k.transpose(-1, -2)), allowed, q.dtype)
    return torch.matmul(first, vw)


def bet_sf_fused(q: Tensor, k: Tensor, v: Tensor, w: Tensor, allowed: Tensor, keep_diagonal: bool = False,
                 dropout_p: float = 0.0) -> Tensor:
    """BET(SF) without materialising A': R is folded into the keys, ``(Q K^T) * R = Q (R ⊙ K)^T``
    column-wise, so the second pass is one SDPA call (flash / memory-efficient kernels on GPU)."""
    w_h, w_k = split_bet_w(w, q.size(3), q.dtype)
    hw = first_pass_value_scores(q, k, torch.matmul(v, w_h), allowed)
    r = bet_key_scores(hw, k, w_k)
    final_allowed = second_pass_allowed(allowed, keep_diagonal, q.size(2), k.size(2), q.device)
    return safe_sdpa(q, k * r.unsqueeze(-1), v, final_allowed, dropout_p)


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


def hopfield_logits(xi: Tensor, k: Tensor, beta: float, steps: int, allowed: Optional[Tensor]) -> Tensor:
    """Ramsauer et al. 2020: ``steps - 1`` updates ``xi <- softmax(beta xi K^T) K`` of the (unscaled)
    state patterns, then the final logits ``beta xi K^T``."""
    kt = k.transpose(-1, -2)
    for _ in range(steps - 1):
        xi = torch.matmul(masked_softmax(beta * torch.matmul(xi, kt), allowed, xi.dtype), k)
    return beta * torch.matmul(xi, kt)


def relative_sinusoids(length: int, dim: int, device=None, dtype=torch.float) -> Tensor:
    """Transformer-XL's R_d for the distances d = 0 .. length-1: (length, dim), [sin ; cos]."""
    if dim % 2:
        raise ValueError(f"the relative sinusoid needs an even model dimension, got {dim}")
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=device, dtype=torch.float) / dim))
    angles = torch.arange(length, device=device, dtype=torch.float).unsqueeze(1) * inv_freq
    return torch.cat([angles.sin(), angles.cos()], dim=-1).to(dtype)


def relative_logits(q: Tensor, k: Tensor, r: Tensor, u: Tensor, v: Tensor, clamp_len: Optional[int] = None) -> Tensor:
    """Transformer-XL (Dai et al. 2019, 3.3): ``(q_i + u)^T k_j + (q_i + v)^T r_{i-j}``.

    q (B, H, T, d), k (B, H, S, d) with the queries at the last T positions; r (H, S, d) the projected
    sinusoids of the distances 0 .. S-1; u, v (H, d). The distance term is computed once per distance
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
