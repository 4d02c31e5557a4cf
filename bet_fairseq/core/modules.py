"""A drop-in BET(SF) causal self-attention for any PyTorch model (batch-first, no fairseq), with a decoding cache."""

import math
from typing import Dict, Optional

import torch
from torch import Tensor, nn

from .incremental import bet_sf_with_state
from .masks import causal_allowed


class BirdEyeCache:
    """What the ``BirdEyeSelfAttention`` layers of one model keep between decoding steps, batch-first: per layer the
    keys, values, R and ``V w_h`` of the positions seen so far and which of them are padding. R of a key depends
    only on positions up to it, so it is computed once; each step then costs one query row per layer.

    One object for the whole model (each layer files its tensors under itself); ``reorder(order)`` after each
    beam-search step, ``len(cache)`` the positions seen (the offset of the next position embedding)."""

    FIELDS = ("k", "v", "r", "vw", "padding")

    def __init__(self):
        self.layers: Dict[nn.Module, Dict[str, Tensor]] = {}

    def __len__(self) -> int:
        return next(iter(self.layers.values()))["k"].size(2) if self.layers else 0

    @property
    def batch_size(self) -> Optional[int]:
        """The batch the cached positions belong to (None while empty)."""
        return next(iter(self.layers.values()))["k"].size(0) if self.layers else None

    def get(self, layer: nn.Module) -> Optional[Dict[str, Tensor]]:
        return self.layers.get(layer)

    def append(self, layer: nn.Module, **new: Tensor):
        """Add the new positions' tensors (the ``FIELDS``; time is the last dimension of each but k and v's 3rd)."""
        past = self.layers.get(layer)
        self.layers[layer] = new if past is None else {
            name: torch.cat([past[name], new[name]], dim=2 if name in ("k", "v") else -1) for name in self.FIELDS}

    def reorder(self, order: Tensor):
        """Keep batch rows ``order`` (beam search: the beams each survivor came from)."""
        if not isinstance(order, Tensor) or order.dim() != 1 or order.dtype not in (torch.long, torch.int32):
            got = f"{order.dtype} {tuple(order.shape)}" if isinstance(order, Tensor) else type(order).__name__
            raise ValueError(f"BirdEyeCache.reorder: order must be a 1-D integer tensor of batch rows, got {got}")
        size = self.batch_size
        if size is not None and order.numel() and not (0 <= int(order.min()) and int(order.max()) < size):
            raise ValueError(f"BirdEyeCache.reorder: order holds rows {int(order.min())}..{int(order.max())}, the "
                             f"cache holds a batch of {size} (rows 0..{size - 1})")
        for entry in self.layers.values():
            for name in self.FIELDS:
                entry[name] = entry[name].index_select(0, order.to(entry[name].device))


class BirdEyeSelfAttention(nn.Module):
    """BET(SF) causal self-attention: ``forward(x (B, T, E), padding_mask (B, T) or None) -> (B, T, E)``.

    The same parameters as a standard multi-head attention (q, k, v, out projections) plus ``w``:
    ``2 * head_dim`` values per head (one shared row with ``share_w``). ``keep_diagonal`` drops the
    DiagFreeMask. ``return_attention=True`` also returns the final per-head matrix ``(B, H, T, S)``.
    ``cache=BirdEyeCache()``: incremental decoding; ``x`` holds only the new positions, which see the cached ones
    (``padding_mask`` covers the new positions), and the cache gains them.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 keep_diagonal: bool = False, share_w: bool = False):
        super().__init__()
        if not (isinstance(num_heads, int) and num_heads >= 1 and isinstance(embed_dim, int) and embed_dim >= 1):
            raise ValueError(f"BirdEyeSelfAttention: embed_dim and num_heads must be integers >= 1, got embed_dim "
                             f"{embed_dim!r}, num_heads {num_heads!r}")
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.w = nn.Parameter(torch.empty(1 if share_w else num_heads, 2 * self.head_dim))
        bound = 1.0 / math.sqrt(2 * self.head_dim)
        nn.init.uniform_(self.w, -bound, bound)
        self.keep_diagonal = keep_diagonal
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, padding_mask: Tensor = None, return_attention: bool = False,
                cache: Optional[BirdEyeCache] = None):
        self._check_inputs(x, padding_mask, cache)
        bsz, length, dim = x.shape
        q, k, v = self.qkv(x).view(bsz, length, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q = q * self.head_dim ** -0.5
        padding = (torch.zeros(bsz, length, dtype=torch.bool, device=x.device) if padding_mask is None
                   else padding_mask.bool())
        past = None if cache is None else cache.get(self)
        if past is not None:
            k, v = torch.cat([past["k"], k], dim=2), torch.cat([past["v"], v], dim=2)
            padding = torch.cat([past["padding"], padding], dim=1)
        src_len = k.size(2)
        allowed = causal_allowed(length, src_len, x.device)
        if padding_mask is not None or past is not None:
            allowed = allowed & ~padding.view(bsz, 1, 1, src_len)
        if length == 1 and past is not None and not bool(padding.any()):
            allowed = None  # one step that sees every key: the decoding step's own fast path
        p = self.dropout.p if self.training else 0.0
        out, probs, r, vw = bet_sf_with_state(
            q, k, v, self.w, allowed, self.keep_diagonal, p, None if past is None else past["r"],
            None if past is None else past["vw"], need_state=cache is not None, need_weights=return_attention)
        if cache is not None:
            cache.append(self, k=k[:, :, -length:], v=v[:, :, -length:], r=r, vw=vw, padding=padding[:, -length:])
        out = self.out_proj(out.transpose(1, 2).reshape(bsz, length, dim))
        return (out, probs) if return_attention else out

    def _check_inputs(self, x, padding_mask, cache):
        """A ValueError naming the expected shape or dtype, instead of torch's error from deep inside."""
        dim = self.qkv.in_features
        if not isinstance(x, Tensor) or x.dim() != 3 or x.size(-1) != dim:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"BirdEyeSelfAttention: x must be (B, T, {dim}) (batch-first, embed_dim {dim}), got {got}")
        if x.dtype != self.qkv.weight.dtype:
            raise ValueError(f"BirdEyeSelfAttention: x is {x.dtype}, the layer's parameters are "
                             f"{self.qkv.weight.dtype}: pass {self.qkv.weight.dtype} input (or convert the layer with "
                             ".to(dtype))")
        bsz, length = x.shape[:2]
        if padding_mask is not None and (not isinstance(padding_mask, Tensor)
                                         or tuple(padding_mask.shape) != (bsz, length)):
            got = tuple(padding_mask.shape) if isinstance(padding_mask, Tensor) else type(padding_mask).__name__
            raise ValueError(f"BirdEyeSelfAttention: padding_mask must be (B, T) = {(bsz, length)} (True at padding"
                             f"{' of the new positions' if cache is not None else ''}), got {got}")
        size = None if cache is None or cache.get(self) is None else cache.batch_size
        if size is not None and size != bsz:
            raise ValueError(f"BirdEyeSelfAttention: the cache holds a batch of {size}, x a batch of {bsz}: feed the "
                             "same batch, or reorder the cache (BirdEyeCache.reorder) first")
