"""What every model family's BET attention shares: the options a config records, ``w``, the masks read from
transformers', and the cache layout that keeps R and ``V w_h`` beside each cached key.

Why a module and not only an ``AttentionInterface`` function: such a function gets the keys and values after the
cache update and never the cache, so it could not keep R and ``V w_h`` of past keys. The BET attention module of a
family computes the stock projections, then calls ``BetAttentionMixin.bet_attend`` here.

The cache: a layer's value tensor in transformers' ``DynamicCache`` holds ``[V | V w_h | R]`` per key-value head,
``head_dim + 2 * groups`` columns (``groups`` query heads share a key-value head; their ``V w_h`` and R are columns
of it), so whatever the cache does along the batch and time (append, beam-search ``reorder_cache``,
``batch_repeat_interleave``, ``crop``, ``batch_select_indices``) keeps R and ``V w_h`` with their keys. The static
cache (``BetStaticCache``, ``cache_implementation="static"``) preallocates the same columns: its queries stand at
the layer's ``cumulative_length`` among ``max_cache_len`` slots, the unwritten ones masked out.

Under torch.compile and torch.export (``core.masks.tracing``) nothing here branches on a tensor's values: the masks
are decided from shapes and flags, and the per-forward mask memo of the eager path is skipped.
"""

import functools
import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn
from transformers import initialization as hf_init
from transformers.cache_utils import DynamicLayer, StaticCache, StaticLayer

from ..core.functional import bet_key_scores, scale_diagonal, split_bet_w
from ..core.kernels import bet_sf_causal_sdpa
from ..core.incremental import bet_sf_with_state
from ..core.masks import (causal_allowed, diagonal_free, diagonal_free_step_, masked_softmax, safe_sdpa,
                          tracing)

SELF_ATTN_MODES = ("bet_sf", "diag_free", "diag_scale")
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")  # sdpa: the fused path; eager: A' materialised and returned (attentions)


@dataclass(kw_only=True)
class BetConfigFields:
    """The fields a BET config adds to its family's config (the names of the fairseq plugin's options), saved in
    config.json so that ``from_pretrained`` rebuilds the same variant.

    ``self_attn_mode``: ``bet_sf`` (BET(SF), the paper's equations), or the diagonal ablations ``diag_free``
    (Transformer + DiagFreeMask) and ``diag_scale`` (each query's own logit times ``diag_scale``: Reduced 0.2,
    Magnified 2.0). ``bet_keep_diagonal``: BET(SF) without the DiagFreeMask; ``bet_share_w``: one ``w`` for all
    heads."""

    self_attn_mode: str = "bet_sf"
    bet_keep_diagonal: bool = False
    bet_share_w: bool = False
    diag_scale: Optional[float] = None


def check_bet_options(config):
    """A clear error naming the option for a value BET does not take."""
    mode = config.self_attn_mode
    if mode not in SELF_ATTN_MODES:
        raise ValueError(f"self_attn_mode={mode!r}: choose one of {', '.join(SELF_ATTN_MODES)}")
    if mode != "bet_sf" and (config.bet_keep_diagonal or config.bet_share_w):
        raise ValueError(f"bet_keep_diagonal and bet_share_w apply to self_attn_mode='bet_sf', not {mode!r}")
    if mode == "diag_scale" and not (isinstance(config.diag_scale, (int, float)) and config.diag_scale > 0):
        raise ValueError(f"self_attn_mode='diag_scale' needs diag_scale > 0 (0.2 reduced, 2.0 magnified), "
                         f"got {config.diag_scale!r}")
    if mode != "diag_scale" and config.diag_scale is not None:
        raise ValueError(f"diag_scale applies to self_attn_mode='diag_scale', not {mode!r}")


@functools.lru_cache(maxsize=8)
def shared_causal_allowed(tgt_len: int, src_len: int, device) -> Tensor:
    """``causal_allowed``, one tensor per size: every layer of a forward gets the same one, so the fused path's
    masks are derived once per forward (``LastMaskMemo``). Read-only."""
    return causal_allowed(tgt_len, src_len, device)


def allowed_keys(attention_mask: Optional[Tensor], tgt_len: int, src_len: int, device,
                 step_shortcut: bool = True) -> Optional[Tensor]:
    """transformers' 4-D mask as the core's boolean ``allowed`` (True: the query sees the key): the sdpa mask is
    boolean already, eager's is additive (0 where visible), None means causal. None for one step that sees
    every key (the decoding step's fast path, unless ``step_shortcut`` is False; while tracing, only when
    transformers passed no mask)."""
    if attention_mask is None:
        if tgt_len == 1:
            return None
        return causal_allowed(tgt_len, src_len, device) if tracing() else shared_causal_allowed(tgt_len, src_len,
                                                                                                 device)
    if attention_mask.dim() != 4 or tuple(attention_mask.shape[-2:]) != (tgt_len, src_len):
        raise ValueError(f"BET needs a 4-D attention mask (batch, 1, {tgt_len}, {src_len}) as transformers' sdpa "
                         f"and eager masks are, got shape {tuple(attention_mask.shape)}")
    allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
    if tgt_len == 1 and step_shortcut and not tracing() and bool(allowed.all()):
        return None
    return allowed


def repeat_heads(x: Tensor, groups: int) -> Tensor:
    """(B, kv_heads, S, d) -> (B, kv_heads * groups, S, d): query head h reads key-value head h // groups."""
    if groups == 1:
        return x
    bsz, heads, length, dim = x.shape
    return x[:, :, None].expand(bsz, heads, groups, length, dim).reshape(bsz, heads * groups, length, dim)


def per_query_head(columns: Tensor) -> Tensor:
    """(B, kv_heads, S, groups) cache columns -> (B, kv_heads * groups, S), the core's per-head layout."""
    return columns.permute(0, 1, 3, 2).flatten(1, 2)


def per_kv_head(x: Tensor, kv_heads: int) -> Tensor:
    """(B, heads, S) -> (B, kv_heads, S, groups), the inverse of ``per_query_head``."""
    return x.unflatten(1, (kv_heads, -1)).permute(0, 1, 3, 2)


def extra_value_columns(config) -> int:
    """The columns BET adds to each cached value row: ``V w_h`` and R of each query head that reads the key-value
    head (BET(SF)), none for the diagonal ablations."""
    if config.self_attn_mode != "bet_sf":
        return 0
    heads = config.num_attention_heads
    return 2 * (heads // (getattr(config, "num_key_value_heads", None) or heads))


class BetStaticLayer(StaticLayer):
    """transformers' ``StaticLayer`` whose value buffer has BET's extra columns, ``[V | V w_h | R]``, however it is
    initialised: lazily by the first update (BET's values carry them) or ahead of time by
    ``StaticCache.early_initialization`` (which passes the stock head size, as ``torch.export`` recipes and chunked
    prefill do)."""

    def __init__(self, max_cache_len: int, extra_columns: int = 0, **kwargs):
        super().__init__(max_cache_len, **kwargs)
        self.extra_columns = extra_columns

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        shape = (*key_states.shape[:-1], key_states.size(-1) + self.extra_columns)
        super().lazy_initialization(key_states, value_states.new_zeros(shape))


class BetStaticCache(StaticCache):
    """``StaticCache`` for a BET model: each layer a ``BetStaticLayer``. ``generate(..., cache_implementation=
    "static")`` builds one (``BetModelMixin._prepare_static_cache``); build it yourself to export a decoding step.
    Sliding-window or chunked layers are refused (BET needs full causal attention)."""

    def __init__(self, config, max_cache_len: int, **kwargs):
        super().__init__(config=config, max_cache_len=max_cache_len, **kwargs)
        for idx, layer in enumerate(self.layers):
            if type(layer) is not StaticLayer:
                raise ValueError(f"BetStaticCache: layer {idx} would be a {type(layer).__name__}; BET needs full "
                                 "causal attention in every layer")
        extra = extra_value_columns(config)
        self.layers = [BetStaticLayer(max_cache_len, extra) for _ in self.layers]


class BetAttentionMixin:
    """BET for a family's attention module: ``init_bet`` after the stock ``__init__``, ``bet_attend`` in the forward
    (given the stock q, k, v of the new positions) and ``reset_bet_parameters`` from the model's ``_init_weights``.
    The module needs ``config``, ``layer_idx`` and ``scaling`` (all stock attention modules here have them)."""

    def init_bet(self, config, num_heads: int, num_kv_heads: int, head_dim: int):
        check_bet_options(config)
        self.self_attn_mode = config.self_attn_mode
        self.keep_diagonal, self.diag_scale = bool(config.bet_keep_diagonal), config.diag_scale
        self.bet_heads, self.bet_kv_heads, self.bet_head_dim = num_heads, num_kv_heads, head_dim
        if self.self_attn_mode == "bet_sf":
            # [H_j ; K_j] of one head -> one logit of R_j; per head unless shared (as the fairseq plugin's bet_w).
            self.bet_w = nn.Parameter(torch.empty(1 if config.bet_share_w else num_heads, 2 * head_dim))
            self.reset_bet_parameters()

    def reset_bet_parameters(self):
        """``w`` uniform in ``±1/sqrt(2 * head_dim)``, as the fairseq plugin; left alone when loaded from a
        checkpoint (transformers' init functions skip tensors it marked initialised)."""
        if self.self_attn_mode == "bet_sf":
            bound = 1.0 / math.sqrt(2 * self.bet_head_dim)
            hf_init.uniform_(self.bet_w, -bound, bound)

    def cached_layer(self, cache):
        """This layer's ``DynamicLayer`` (None before its first update) or static layer in ``cache``; other layer
        kinds (quantized, sliding-window, offloaded to another layout) would not keep the extra columns: refused."""
        if cache is None or len(cache.layers) <= self.layer_idx:
            return None
        layer = cache.layers[self.layer_idx]
        if type(layer) in (StaticLayer, BetStaticLayer):
            width = self.bet_head_dim + extra_value_columns(self.config)
            if layer.is_initialized and layer.values.size(-1) != width:
                raise ValueError(f"layer {self.layer_idx}'s static cache holds {layer.values.size(-1)} value "
                                 f"columns, BET needs {width} ([V | V w_h | R]): build it as BetStaticCache")
            return layer
        if type(layer) is not DynamicLayer:
            raise ValueError(f"BET keeps R and V w_h in a DynamicCache's or StaticCache's layers; this cache's layer "
                             f"{self.layer_idx} is a {type(layer).__name__} (use cache_implementation='dynamic', "
                             "the default, or 'static')")
        return layer if layer.get_seq_length() > 0 else None

    def bet_attend(self, q: Tensor, k: Tensor, v: Tensor, attention_mask: Optional[Tensor], cache,
                   dropout_p: float):
        """The attention of the new positions: q (B, heads, T, d), k and v (B, kv_heads, T, d), unscaled, as the
        stock module has them before its cache update. Updates ``cache`` (if any) with the new keys; returns the
        heads merged, (B, T, heads * d), and A' (B, heads, T, S) under attn_implementation 'eager' (else None)."""
        impl = self.config._attn_implementation
        if impl not in ATTN_IMPLEMENTATIONS:
            raise ValueError(f"attn_implementation={impl!r}: BET runs its own two-pass attention; use one of "
                             f"{', '.join(ATTN_IMPLEMENTATIONS)} (sdpa: fused; eager: also returns the attentions)")
        need_weights = impl == "eager"
        bsz, _, tgt_len, dim = q.shape
        groups = self.bet_heads // self.bet_kv_heads
        bet = self.self_attn_mode == "bet_sf"
        layer = self.cached_layer(cache)
        if isinstance(layer, StaticLayer):
            out, probs = self.static_attend(q * self.scaling, k, v, attention_mask, cache, layer, dropout_p,
                                            need_weights)
            return out.transpose(1, 2).reshape(bsz, tgt_len, -1), probs
        past_r = past_vw = None
        if layer is not None:
            past_v = layer.values[..., :dim]
            if bet:
                if layer.values.size(-1) != dim + 2 * groups:
                    raise ValueError(f"layer {self.layer_idx}'s cached values have {layer.values.size(-1)} columns, "
                                     f"BET(SF) caches {dim + 2 * groups} ([V | V w_h | R]): a cache filled by "
                                     "another model")
                past_vw = per_query_head(layer.values[..., dim:dim + groups])
                past_r = per_query_head(layer.values[..., dim + groups:])
            k_all, v_all = torch.cat([layer.keys, k], dim=2), torch.cat([past_v, v], dim=2)
        else:
            k_all, v_all = k, v
        allowed = allowed_keys(attention_mask, tgt_len, k_all.size(2), q.device)
        q = q * self.scaling
        kh, vh = repeat_heads(k_all, groups), repeat_heads(v_all, groups)
        if bet and tracing() and attention_mask is None and cache is None and not need_weights:
            # Compiled, causal, no padding (transformers passes no mask then): the causal form with no mask tensor,
            # which the eager path reaches on GPUs by comparing the mask with the causal one (a read of data).
            out, probs = bet_sf_causal_sdpa(q, kh, vh, self.bet_w, self.keep_diagonal, dropout_p), None
        elif bet:
            out, probs, r, vw = bet_sf_with_state(q, kh, vh, self.bet_w, allowed, self.keep_diagonal, dropout_p,
                                                  past_r, past_vw, need_state=cache is not None,
                                                  need_weights=need_weights)
            cached_v = None if cache is None else torch.cat(
                [v, per_kv_head(vw, self.bet_kv_heads).to(v.dtype), per_kv_head(r, self.bet_kv_heads).to(v.dtype)],
                dim=-1)
        else:
            out, probs = diagonal_ablation(q, kh, vh, allowed, self.self_attn_mode, self.diag_scale, dropout_p,
                                           need_weights)
            cached_v = v
        if cache is not None:
            cache.update(k, cached_v, self.layer_idx)
        return out.transpose(1, 2).reshape(bsz, tgt_len, -1), probs

    def static_attend(self, q: Tensor, k: Tensor, v: Tensor, attention_mask: Optional[Tensor], cache, layer,
                      dropout_p: float, need_weights: bool):
        """``bet_attend`` over a static cache layer: the T new queries (q scaled) stand at positions
        ``cumulative_length + 0 .. T-1`` among the layer's S = ``max_cache_len`` slots and see the slots the mask
        allows (transformers' mask covers all S; without one, the slots up to their own). The new keys' values go
        in with their ``V w_h`` (which needs only V) and R = 0, then R, which needs the first pass over the
        written keys, replaces that 0. Every shape is fixed by the cache, so a compiled decoding step is one graph."""
        bsz, _, tgt_len, dim = q.shape
        groups = self.bet_heads // self.bet_kv_heads
        position = layer.cumulative_length + torch.arange(tgt_len, device=q.device)  # before the update moves it
        bet = self.self_attn_mode == "bet_sf"
        if bet:
            w_h, w_k = split_bet_w(self.bet_w, dim, q.dtype)
            vw = torch.matmul(repeat_heads(v, groups), w_h).squeeze(-1)  # (B, heads, T)
            cached_v = torch.cat([v, per_kv_head(vw, self.bet_kv_heads).to(v.dtype),
                                  torch.zeros_like(v[..., :groups])], dim=-1)
        else:
            cached_v = v
        keys, values = cache.update(k, cached_v, self.layer_idx)
        src_len = keys.size(2)
        slots = torch.arange(src_len, device=q.device)
        if attention_mask is None:
            allowed = (slots <= position[:, None]).view(1, 1, tgt_len, src_len)
        else:
            allowed = allowed_keys(attention_mask, tgt_len, src_len, q.device, step_shortcut=False)
        own = slots == position[:, None]  # (T, S): each query's own slot
        kh, vh = repeat_heads(keys, groups), repeat_heads(values[..., :dim], groups)
        if not bet:
            return diagonal_ablation(q, kh, vh, allowed, self.self_attn_mode, self.diag_scale, dropout_p,
                                     need_weights, own)
        scores = torch.matmul(q, kh.transpose(-1, -2))
        first = masked_softmax(scores, allowed, q.dtype)
        vw_all = per_query_head(values[..., dim:dim + groups]).to(q.dtype)
        r_new = bet_key_scores(torch.matmul(first, vw_all.unsqueeze(-1)), repeat_heads(k, groups), w_k)
        r_slots = values[..., dim + groups:]
        r_slots.index_copy_(2, position, per_kv_head(r_new, self.bet_kv_heads).to(values.dtype))
        r = per_query_head(r_slots).to(q.dtype)
        probs = masked_softmax(scores * r.unsqueeze(2), allowed if self.keep_diagonal else diagonal_free(allowed, own),
                               q.dtype)
        dropped = nn.functional.dropout(probs, dropout_p) if dropout_p > 0 else probs
        return torch.matmul(dropped, vh), probs if need_weights else None


def diagonal_ablation(q: Tensor, k: Tensor, v: Tensor, allowed: Optional[Tensor], mode: str, scale: Optional[float],
                      dropout_p: float, need_weights: bool, own: Optional[Tensor] = None):
    """Transformer + DiagFreeMask (``diag_free``: SDPA under the mask unless weights are asked for) or the scaled
    diagonal (``diag_scale``); q comes scaled. ``own`` (T, S): True at each query's own key (a static cache's);
    default: the queries are the last T keys. Returns ``(out, weights or None)``."""
    if mode == "diag_free" and not need_weights and allowed is not None:
        return safe_sdpa(q, k, v, diagonal_free(allowed, own), dropout_p), None
    logits = torch.matmul(q, k.transpose(-1, -2))
    if mode == "diag_scale":
        logits = scale_diagonal(logits, scale) if own is None else torch.where(own, logits * scale, logits)
    elif allowed is None:
        diagonal_free_step_(logits)
    else:
        allowed = diagonal_free(allowed, own)
    probs = masked_softmax(logits, allowed, q.dtype)
    dropped = nn.functional.dropout(probs, dropout_p) if dropout_p > 0 else probs
    return torch.matmul(dropped, v), probs if need_weights else None
