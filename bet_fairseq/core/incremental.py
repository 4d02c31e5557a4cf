"""BET(SF) over new queries that see keys decoded before them, handing back R and ``V w_h`` of the new keys for a
cache. The plain-PyTorch module's cache and the Hugging Face integration both call it, so they keep the same numbers
and the same path (``core/paths.py``)."""

from typing import Optional

import torch.nn.functional as F
from torch import Tensor

from .functional import bet_sf_attention
from .paths import BetPath, bet_sf_fused, choose_path


def bet_sf_with_state(q: Tensor, k: Tensor, v: Tensor, w: Tensor, allowed: Optional[Tensor],
                      keep_diagonal: bool = False, dropout_p: float = 0.0, past_r: Optional[Tensor] = None,
                      past_vw: Optional[Tensor] = None, need_state: bool = False, need_weights: bool = False):
    """BET(SF) of the T queries ``q`` (B, H, T, d, scaled) over all S keys ``k, v`` (B, H, S, d), the last T new.

    ``past_r`` / ``past_vw`` (B, H, S - T): R and ``V w_h`` of the earlier keys (a cache's; they never change once
    computed). ``allowed``: as in ``bet_sf_logits`` (None: every key visible, only right for one decoding step).
    Returns ``(out (B, H, T, d), A' or None, R and V w_h of the T new keys or None)``: without a cache to fill
    (``need_state``), earlier keys or weights asked for, a fused path (``choose_path``'s: no T x S matrix kept for
    the backward);
    otherwise the exact one, which also gives R and ``V w_h``. ``dropout_p``: attention dropout on A' (pass 0 in eval).
    """
    new = k.size(2) - q.size(2)
    if new and (past_r is None or past_vw is None or past_r.size(2) != new or past_vw.size(2) != new):
        raise ValueError(f"R and V w_h of the {new} keys before the {q.size(2)} queries are needed (past_r, past_vw)")
    path = choose_path(q, k, allowed, keep_diagonal, dropout_p, fused=not (need_state or need_weights or new))
    if path is not BetPath.EXACT:
        return bet_sf_fused(q, k, v, w, allowed, keep_diagonal, dropout_p, path=path), None, None, None
    dropout = (lambda probs: F.dropout(probs, dropout_p)) if dropout_p > 0 else None
    out, probs, _, r, vw = bet_sf_attention(q, k, v, w, allowed, keep_diagonal, dropout, past_r, past_vw)
    return out, probs if need_weights else None, r[:, :, new:], vw[:, :, new:]
