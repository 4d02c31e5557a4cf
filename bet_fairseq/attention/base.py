"""``SelfAttentionVariant``: the one fairseq-facing skeleton every decoder self-attention variant shares.

It owns, once: the projections, the K/V cache and any per-key cache of a variant (batch-first, so
fairseq's ``reorder_incremental_state`` reorders it for beam search), the masks (as booleans), capture
of the attention for losses and analysis, dropout, ``out_proj``, head averaging, rows that see no key
(zero output, never NaN) and half precision (logits and softmax in float32). A variant overrides
hooks, from the smallest to the fullest:

``scores(q, k, allowed)``        logits (B, H, T, S) before masking; ``q`` comes scaled.
``restrict(q, k, allowed)``      a smaller boolean mask (DiagFreeMask, routing clusters).
``project(query, context)``      q, k, v (B, H, length, d) from the inputs (Hopfield's values).
``attend(q, k, v, allowed, cache, exact)``  the whole computation (two passes, per-key caches).

A query block is always the *last* T of the S key positions, so one code path serves a full sequence,
one incremental decoding step and a context longer than the queries (Transformer-XL's memory).

A variant may also replace a model's other attention sites (``sites``, ``build_site_attention``): the
encoder self-attention and the encoder-decoder attention, with fairseq ``MultiheadAttention`` subclasses.
"""

from typing import ClassVar, Dict, FrozenSet, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from fairseq.modules.multihead_attention import MultiheadAttention

from ..core.masks import (COMPUTE, LastMaskMemo, causal_allowed, masked_log_softmax, masked_softmax, rows_without_keys,
                          safe_sdpa)
from ..errors import InputError
from .sites import DECODER_SELF

# every layer gets a view of the decoder's one buffered causal mask: converted once
_ALLOWED_FROM_FLOAT_MASK = LastMaskMemo(lambda mask, tgt_len, src_len: torch.isfinite(mask).view(1, 1, tgt_len,
                                                                                                 src_len))
IncrementalState = Optional[Dict[str, Dict[str, Optional[Tensor]]]]
CACHE_PREFIX = "prev_variant_"


class Attended(NamedTuple):
    out: Tensor  # (B, H, T, d)
    probs: Optional[Tensor] = None  # (B, H, T, S), the weights applied to V (None on fused paths)
    cache: Dict[str, Tensor] = {}  # per-key tensors of all S keys, (B, H, S) batch-first
    first_pass: Optional[Tensor] = None  # a variant's intermediate matrix worth capturing (BET's A)
    log_probs: Optional[Tensor] = None  # log of ``probs`` in float32, computed in log space (when capturing)


class SelfAttentionVariant(MultiheadAttention):
    """A fairseq ``MultiheadAttention`` for causal decoder self-attention, built to be subclassed.

    ``capture_attention``: when set, every forward keeps the attention it used (per head, before
    dropout, with gradients) in ``captured_attention`` (B, H, T, S), its log computed in log space in
    ``captured_log_attention`` (float32; for losses on attention, which must not underflow), and a
    variant's intermediate matrix (BET(SF)'s first pass) in ``captured_first_pass``.
    """

    variant_name: ClassVar[str] = "base"
    options_class: ClassVar[Optional[type]] = None  # the dataclass of this variant's options
    masks_diagonal: bool = False  # True where a query may never see itself (no pointer loss then)
    # The attention sites (``attention.sites``) this variant may replace; other than DECODER_SELF, each one
    # is built by ``build_site_attention``.
    sites: ClassVar[FrozenSet[str]] = frozenset({DECODER_SELF})

    def __init__(self, embed_dim, num_heads, options=None, **kwargs):
        kwargs.setdefault("self_attention", True)
        super().__init__(embed_dim, num_heads, **kwargs)
        if not self.self_attention:
            raise ValueError(f"self-attention variant {self.variant_name!r} needs self_attention=True")
        if self.bias_k is not None or self.add_zero_attn:
            raise ValueError(f"self-attention variant {self.variant_name!r} does not support add_bias_kv/add_zero_attn")
        if options is None and self.options_class is not None:
            options = self.options_class()
        self.options = options
        self.check_options(options, num_heads)
        self.capture_attention = False
        self.captured_attention: Optional[Tensor] = None
        self.captured_first_pass: Optional[Tensor] = None
        self.captured_log_attention: Optional[Tensor] = None
        self.use_fused_attention = True

    @classmethod
    def check_options(cls, options, num_heads: int):
        """Raise a ValueError naming the flag of any bad option (called before a model is built)."""

    @classmethod
    def model_option_defaults(cls, model_sites: FrozenSet[str]) -> Dict[str, object]:
        """Defaults of this variant's options that depend on the model, which has ``model_sites``; filled
        where the command line (or checkpoint) left the option unset."""
        return {}

    @classmethod
    def build_site_attention(cls, site: str, options, embed_dim: int, num_heads: int,
                             **mha_kwargs) -> Optional[MultiheadAttention]:
        """The attention at ``site``, one of ``sites`` other than DECODER_SELF: a fairseq
        ``MultiheadAttention`` built from the keyword arguments fairseq's layer would give its own
        (``kdim``, ``dropout``, ``encoder_decoder_attention`` ...); None keeps fairseq's there."""
        return None

    def extra_repr(self):
        return f"variant={self.variant_name}" + ("" if self.options is None else f", options={self.options}")

    # ------------------------------------------------------------------------------- hooks
    def project(self, query: Tensor, context: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """(T, B, E) query and (S', B, E) key context -> q (scaled), k, v as (B, H, length, d)."""
        q = self.split_heads(self.q_proj(query) * self.scaling)
        return q, self.split_heads(self.k_proj(context)), self.split_heads(self.v_proj(context))

    def scores(self, q: Tensor, k: Tensor, allowed: Optional[Tensor]) -> Tensor:
        """Logits (B, H, T, S) before masking; ``q`` already scaled by 1/sqrt(head_dim)."""
        return torch.matmul(q, k.transpose(-1, -2))

    def restrict(self, q: Tensor, k: Tensor, allowed: Tensor) -> Tensor:
        """The keys each query may use, as a boolean mask broadcastable to (B, H, T, S)."""
        return allowed

    def attend(self, q: Tensor, k: Tensor, v: Tensor, allowed: Optional[Tensor], cache: Dict[str, Tensor],
               exact: bool) -> Attended:
        """The attention itself. ``allowed`` is None when every key is visible (a decoding step without
        padding); ``cache`` holds this variant's per-key tensors of the earlier keys (incremental
        decoding); ``exact``: the weights are needed, so materialise them."""
        if self._overrides("restrict"):
            if allowed is None:
                allowed = causal_allowed(q.size(2), k.size(2), q.device)
            allowed = self.restrict(q, k, allowed)
        if not exact and self.use_fused_attention and not self._overrides("scores"):
            return Attended(safe_sdpa(q, k, v, allowed, self.dropout_p()))
        return self.attend_to_logits(self.scores(q, k, allowed), allowed, v)

    def attend_to_logits(self, logits: Tensor, allowed: Optional[Tensor], v: Tensor,
                         cache: Optional[Dict[str, Tensor]] = None, first_pass: Optional[Tensor] = None,
                         empty=COMPUTE) -> Attended:
        """The exact path's end, shared by every variant that materialises its logits: masked softmax
        (float32), its log in log space when capturing, dropout, ``A V``. ``empty``: the caller's
        ``rows_without_keys(allowed)``, found here when not given."""
        if empty is COMPUTE:
            empty = rows_without_keys(allowed)
        probs = masked_softmax(logits, allowed, v.dtype, empty)
        log_probs = masked_log_softmax(logits, allowed, empty) if self.capture_attention else None
        return Attended(torch.matmul(self.dropout_module(probs), v), probs, cache or {}, first_pass, log_probs)

    def output_projection(self, out: Tensor) -> Tensor:
        """The projection of ``attend``'s output with the heads merged, (T, B, E): ``out_proj``."""
        return self.out_proj(out)

    # ------------------------------------------------------------------------------- skeleton
    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: IncrementalState = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        if static_kv or before_softmax:
            raise ValueError(f"self-attention variant {self.variant_name!r} takes neither static_kv nor before_softmax")
        need_weights = need_weights or need_head_weights
        tgt_len, bsz, embed_dim = query.size()
        # Keys come from the query (self-attention) or from a longer context ending with it (memory).
        context = query if key is None or key is query else key
        q, k, v = self.project(query, context)

        cache: Dict[str, Tensor] = {}
        if incremental_state is not None:
            saved = self._get_input_buffer(incremental_state)
            if "prev_key" in saved:
                k = torch.cat([saved["prev_key"], k], dim=2)
                v = torch.cat([saved["prev_value"], v], dim=2)
                cache = {name[len(CACHE_PREFIX):]: t for name, t in saved.items()
                         if name.startswith(CACHE_PREFIX) and t is not None}
            key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
                key_padding_mask=key_padding_mask,
                prev_key_padding_mask=saved.get("prev_key_padding_mask"),
                batch_size=bsz,
                src_len=k.size(2),
                static_kv=False,
            )
        src_len = k.size(2)
        if incremental_state is not None and tgt_len == 1 and attn_mask is None and key_padding_mask is None:
            allowed = None  # one decoding step sees every cached key: no mask tensors at all
        else:
            allowed = self.allowed_keys(tgt_len, src_len, attn_mask, key_padding_mask, query.device)

        exact = need_weights or self.capture_attention or incremental_state is not None
        result = self.attend(q, k, v, allowed, cache, exact)

        if incremental_state is not None:
            saved["prev_key"], saved["prev_value"] = k, v
            saved["prev_key_padding_mask"] = key_padding_mask
            for name, t in result.cache.items():
                saved[CACHE_PREFIX + name] = t
            self._set_input_buffer(incremental_state, saved)
        if self.capture_attention:
            self.captured_attention = result.probs
            self.captured_first_pass = result.first_pass
            self.captured_log_attention = result.log_probs

        out = self.output_projection(result.out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim))
        weights = None
        if need_weights and result.probs is not None:
            weights = result.probs.transpose(0, 1)  # heads x bsz x tgt x src, as fairseq returns it
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return out, weights

    # ------------------------------------------------------------------------------- helpers
    def split_heads(self, x: Tensor) -> Tensor:
        """(L, B, E) -> (B, H, L, d): batch-first, as the cache must be."""
        return x.view(x.size(0), x.size(1), self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    @staticmethod
    def allowed_keys(tgt_len, src_len, attn_mask, key_padding_mask, device) -> Tensor:
        """Boolean (B or 1, 1, T, S) from fairseq's float causal mask and key padding mask."""
        if attn_mask is not None and attn_mask.size(-1) == src_len:
            allowed = _ALLOWED_FROM_FLOAT_MASK(attn_mask, tgt_len, src_len)
        else:  # no mask, or fairseq's T x T mask under a longer context: causal by position
            allowed = causal_allowed(tgt_len, src_len, device)
        if key_padding_mask is not None:
            allowed = allowed & ~key_padding_mask.bool().view(-1, 1, 1, src_len)
        return allowed

    def dropout_p(self) -> float:
        """The attention dropout probability to hand to a fused kernel."""
        module = self.dropout_module
        return module.p if (self.training or module.apply_during_inference) else 0.0

    def _overrides(self, hook: str) -> bool:
        return getattr(type(self), hook) is not getattr(SelfAttentionVariant, hook)

    # ------------------------------------------------------------------------------- checkpoints
    def upgrade_state_dict_named(self, state_dict, name):
        """Refuse a checkpoint whose attention parameters belong to another variant, by name."""
        super().upgrade_state_dict_named(state_dict, name)
        prefix = name + "." if name != "" else ""
        own = {prefix + n for n, _ in self.named_parameters()} | {prefix + n for n, _ in self.named_buffers()}
        theirs = {k for k in state_dict if k.startswith(prefix)}
        extra, missing = sorted(theirs - own), sorted(own - theirs)
        if extra or missing:
            what = f"holds {extra[0]}" if extra else f"has no {missing[0]}"
            raise InputError(
                f"checkpoint {what}, which a {self.variant_name!r} self-attention "
                f"{'does not have' if extra else 'needs'}: it was trained with another --self-attn-mode; "
                "build the model with the --arch and options it was trained with"
            )
