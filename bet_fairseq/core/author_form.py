"""BET(SF) as the first author's public code computes it (``--bet-form authors`` / ``authors_lm``; docs/method.md,
"BET(SF) re-weighting", the authors' code forms).

The paper's equations (``core/functional.py``) give each head its own ``w`` on ``[H_j ; K_j]`` with H the first
pass's per-head output. That code instead has one ``Linear(2 d, 1)`` with a bias per layer, shared by the heads,
fed with ``[K_j ; H_j]`` (the fairseq fork) or ``[Q_j / sqrt(d) ; H_j]`` (the language-model repository), where H
is the first pass's output AFTER the output projection, split back into heads; attention dropout applies to the
first pass too, and a second output projection follows the second pass (the caller's).
"""

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .functional import merge_heads, second_pass_allowed, split_heads
from .masks import masked_softmax

BET_R_INPUTS = ("key", "query")  # what R sees beside H: the fairseq fork's K, or the language-model code's Q


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
