"""Which computation of BET(SF) runs: ``choose_path``, the one place that decides, and ``bet_sf_fused``, which runs
the fused path it picks. Every path gives the equations' numbers (``core/functional.py``) within float rounding;
they differ in speed and in what they keep for the backward.
"""

import enum
from typing import Optional

import torch
from torch import Tensor

from .kernels import KERNEL_MASKS, bet_sf_causal_sdpa, bet_sf_cpu_kernel, bet_sf_folded_sdpa
from .masks import causal_allowed, tracing


class BetPath(str, enum.Enum):
    EXACT = "exact"  # the equations themselves: A and A' materialised (bet_sf_logits, bet_authors_logits)
    CPU_KERNEL = "cpu_kernel"  # kernels._BetSFCausal: both passes per query range, hand-written backward
    CAUSAL_SDPA = "causal_sdpa"  # kernels.bet_sf_causal_sdpa: SDPA with is_causal, no mask tensor
    FOLDED_SDPA = "folded_sdpa"  # R folded into the keys, the second pass one SDPA call (both forms)


# On CPU, up to this many keys the exact path is a little faster than the fused kernel; from 128 keys on the kernel
# is as fast and keeps no T x S matrix (docs/performance.md). The fairseq variant's default threshold.
CPU_EXACT_MAX_KEYS = 64


def choose_path(q: Tensor, k: Tensor, allowed: Optional[Tensor], keep_diagonal: bool = False,
                dropout_p: float = 0.0, *, fused: bool = True, form: str = "equations",
                cpu_exact_max_keys: int = 0) -> BetPath:
    """The path that computes BET(SF) of the queries ``q`` over the keys ``k`` under ``allowed`` (as
    ``bet_sf_logits``'s arguments), first rule that applies:

    1. ``EXACT`` unless the caller allows a fused path (``fused``): a caller that needs A', R or ``V w_h`` (the
       attention weights asked for, a capture, a decoding cache to fill, queries after cached keys) or turned
       the fused paths off gets the equations, which keep all of them.
    2. ``EXACT`` on CPU with at most ``cpu_exact_max_keys`` keys: there the materialised matrices are cheap and
       the exact path slightly faster (``CPU_EXACT_MAX_KEYS``, the fairseq variant's threshold; 0: never).
    3. ``FOLDED_SDPA`` for the authors' forms (``form`` other than ``"equations"``): their only fused path.
    4. ``CPU_KERNEL`` on CPU in float32 without attention dropout when the mask suits ``_BetSFCausal``
       (``kernels.kernel_masks``: T == S, no row without keys): the fastest CPU path and the one that keeps
       least, since both passes share one ``Q K^T`` per query range.
    5. ``CAUSAL_SDPA`` on GPUs under the plain causal mask (one mask for the batch, T == S): SDPA's
       ``is_causal`` needs no mask tensor, so memory stays linear in T.
    6. ``FOLDED_SDPA`` otherwise (padding on GPUs, bfloat16 or attention dropout on CPU, ``allowed=None``), and
       while traced (``torch.compile``, ``torch.export``: ``masks.tracing``), where rules 4 and 5 would read the
       mask's values to decide and a graph cannot branch on data (a caller that knows the mask is the plain
       causal one, as the Hugging Face integration does, passes ``path=CAUSAL_SDPA`` itself).

    Callers: the fairseq variant (``attention/bet_sf.py``), ``bet_sf_with_state`` (``core/incremental.py``: the
    plain-PyTorch module and the Hugging Face integration) and ``bet_sf_fused``. The one-token decoding step
    (``core/decoding_step.py``) is chosen before the projections, by the variant's ``forward``, when the step sees
    every cached key and needs no weights.
    """
    cpu = q.device.type == "cpu"
    if not fused or (cpu and k.size(2) <= cpu_exact_max_keys):
        return BetPath.EXACT
    if form != "equations" or allowed is None:
        return BetPath.FOLDED_SDPA
    if cpu:
        if (dropout_p == 0.0 and q.dtype == torch.float32 and not tracing()
                and KERNEL_MASKS(allowed, keep_diagonal, q.size(2), k.size(2)) is not None):
            return BetPath.CPU_KERNEL
        return BetPath.FOLDED_SDPA
    if (allowed.size(0) == 1 and q.size(2) == k.size(2) and not tracing()
            and torch.equal(allowed, causal_allowed(q.size(2), k.size(2), q.device))):
        return BetPath.CAUSAL_SDPA
    return BetPath.FOLDED_SDPA


def bet_sf_fused(q: Tensor, k: Tensor, v: Tensor, w: Tensor, allowed: Optional[Tensor], keep_diagonal: bool = False,
                 dropout_p: float = 0.0, path: Optional[BetPath] = None) -> Tensor:
    """BET(SF)'s output ``A' V`` (B, H, T, d) without keeping A' or A for the backward, through ``path`` (default:
    ``choose_path``'s fused path for these arguments); ``dropout_p`` on A'."""
    if path is None:
        path = choose_path(q, k, allowed, keep_diagonal, dropout_p)
    if path is BetPath.CPU_KERNEL:
        return bet_sf_cpu_kernel(q, k, v, w, KERNEL_MASKS(allowed, keep_diagonal, q.size(2), k.size(2)))
    if path is BetPath.CAUSAL_SDPA:
        return bet_sf_causal_sdpa(q, k, v, w, keep_diagonal, dropout_p)
    if path is BetPath.FOLDED_SDPA:
        return bet_sf_folded_sdpa(q, k, v, w, allowed, keep_diagonal, dropout_p)
    raise ValueError(f"bet_sf_fused runs a fused path, not {path!r} (use bet_sf_attention for the exact one)")
