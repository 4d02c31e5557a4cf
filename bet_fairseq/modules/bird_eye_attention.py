"""Decoder causal self-attention with the Bird-Eye re-weighting and the diagonal variants.

One module covers every row of the paper that only changes the decoder's causal self-attention
(BET_SPEC sections 1 and 2):

``vanilla``     fairseq's own attention (delegated to ``MultiheadAttention.forward``).
``diag_scale``  the diagonal logits ``D_ii`` are multiplied by ``c`` before the softmax
                (Reduced: c=0.2, Magnified: c=2.0).
``diag_free``   DiagFreeMask: a query never attends to itself unless it has no other key
                (row 0, which can only see itself).
``bet_sf``      BET(SF): a first pass ``A = softmax(D)``, ``H = A V``; per key ``R_j =
                sigmoid(w . [H_j ; K_j])``; a second pass ``A' = softmax(DiagFreeMask(D * R))``,
                output ``A' V``. ``w`` is the only added parameter.

The same code computes a full sequence and one incremental decoding step: a query block is always
the *last* ``T`` positions of the ``S`` keys, so its diagonal is column ``S - T + i``. The cache
holds K, V (as fairseq does) and R (batch-first, so fairseq's ``reorder_incremental_state``
reorders it for beam search); R of a key never changes once computed, because it depends only on
positions up to that key.

Two implementations of the non-vanilla modes exist: an exact one, which materialises the
attention matrix (needed for attention weights, capture for losses and analysis, and incremental
decoding), and a fused one on ``torch.nn.functional.scaled_dot_product_attention`` used in
training/scoring when no weights are asked for. The R re-weighting is folded into the keys there:
``(Q K^T) * R = Q (R ⊙ K)^T`` column-wise. Tests hold the fused path to the exact one.

Speed (docs/performance.md): H enters R only through ``H w_h = A (V w_h)``, so neither path forms H;
the first pass attends over one value column per head, and decoding caches ``V w_h`` per key
(``prev_bet_vw``) so a step reads V once, as vanilla does. On CPU, bet_sf with at most
``cpu_exact_max_keys`` keys takes the exact path even when ``use_fused_attention`` is set: one
``Q K^T`` shared by both passes is faster there than two SDPA calls.
"""

import math
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fairseq.modules.multihead_attention import MultiheadAttention

ATTENTION_MODES = ("vanilla", "diag_scale", "diag_free", "bet_sf")

IncrementalState = Optional[Dict[str, Dict[str, Optional[Tensor]]]]


def validate_attention_settings(mode: str, diag_scale: float, keep_diagonal: bool, share_w: bool):
    """Raise a ValueError naming the bad option; shared by the module and the model builders."""
    if mode not in ATTENTION_MODES:
        raise ValueError(
            f"--self-attn-mode: unknown mode {mode!r}; choose one of {', '.join(ATTENTION_MODES)}"
        )
    try:
        diag_scale = float(diag_scale)
    except (TypeError, ValueError):
        raise ValueError(f"--diag-scale must be a number, got {diag_scale!r}") from None
    if not math.isfinite(diag_scale) or diag_scale <= 0:
        raise ValueError(
            f"--diag-scale must be a finite number > 0 (it multiplies the diagonal logits; "
            f"use --self-attn-mode diag_free to remove the diagonal), got {diag_scale}"
        )
    if mode != "diag_scale" and diag_scale != 1.0:
        raise ValueError(
            f"--diag-scale {diag_scale} only applies to --self-attn-mode diag_scale (mode is {mode!r})"
        )
    if mode != "bet_sf" and (keep_diagonal or share_w):
        raise ValueError(
            "--bet-keep-diagonal and --bet-share-w only apply to --self-attn-mode bet_sf "
            f"(mode is {mode!r})"
        )
    return diag_scale


class BirdEyeMultiheadAttention(MultiheadAttention):
    """fairseq ``MultiheadAttention`` for decoder causal self-attention, with the BET modes.

    ``capture_attention``: when set, every forward stores the attention it used (per head, before
    dropout, with gradients) in ``captured_attention`` (``(bsz, heads, tgt, src)``) and, for
    ``bet_sf``, the first-pass matrix in ``captured_first_pass``. Losses on attention (BET(SG)) and
    the analysis tools read these; nothing is kept when it is off.
    """

    def __init__(
        self,
        embed_dim,
        num_heads,
        mode: str = "vanilla",
        diag_scale: float = 1.0,
        keep_diagonal: bool = False,
        share_w: bool = False,
        **kwargs,
    ):
        kwargs.setdefault("self_attention", True)
        super().__init__(embed_dim, num_heads, **kwargs)
        self.diag_scale = validate_attention_settings(mode, diag_scale, keep_diagonal, share_w)
        if mode != "vanilla" and not self.self_attention:
            raise ValueError(f"self-attention mode {mode!r} needs self_attention=True")
        if mode != "vanilla" and (self.bias_k is not None or self.add_zero_attn):
            raise ValueError(f"self-attention mode {mode!r} does not support add_bias_kv/add_zero_attn")
        self.mode = mode
        self.keep_diagonal = keep_diagonal
        self.share_w = share_w
        if mode == "bet_sf":
            # [H_j ; K_j] of one head -> one logit; per head unless shared.
            self.bet_w = nn.Parameter(torch.empty(1 if share_w else num_heads, 2 * self.head_dim))
            bound = 1.0 / math.sqrt(2 * self.head_dim)
            nn.init.uniform_(self.bet_w, -bound, bound)
        else:
            self.register_parameter("bet_w", None)
        self.capture_attention = False
        self.captured_attention: Optional[Tensor] = None
        self.captured_first_pass: Optional[Tensor] = None
        self.use_fused_attention = True

    # bet_sf on CPU: up to this many keys the exact path, which computes Q K^T once for both
    # passes, beats two SDPA calls (measured in docs/performance.md: 1.6x faster at 25 keys,
    # 1.2x at 100, slower at 512). Set to 0 to always take SDPA when use_fused_attention is on.
    cpu_exact_max_keys = 128

    def _exact_is_faster(self, q: Tensor, src_len: int) -> bool:
        return self.mode == "bet_sf" and q.device.type == "cpu" and src_len <= self.cpu_exact_max_keys

    @property
    def masks_diagonal(self) -> bool:
        return self.mode == "diag_free" or (self.mode == "bet_sf" and not self.keep_diagonal)

    def extra_repr(self):
        extra = f"mode={self.mode}"
        if self.mode == "diag_scale":
            extra += f", diag_scale={self.diag_scale}"
        if self.mode == "bet_sf":
            extra += f", keep_diagonal={self.keep_diagonal}, share_w={self.share_w}"
        return extra

    # ------------------------------------------------------------------------------------------
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
        # fairseq's fused path would average the heads even when per-head weights are asked for.
        if self.mode == "vanilla" and not self.capture_attention and not need_head_weights:
            return super().forward(
                query, key, value, key_padding_mask, incremental_state, need_weights,
                static_kv, attn_mask, before_softmax, need_head_weights,
            )
        # Self-attention: like fairseq's, keys and values are projected from the query.
        if static_kv:
            raise ValueError("BirdEyeMultiheadAttention does not take static_kv")
        need_weights = need_weights or need_head_weights

        tgt_len, bsz, embed_dim = query.size()
        q = self._split_heads(self.q_proj(query) * self.scaling, bsz)
        k = self._split_heads(self.k_proj(query), bsz)
        v = self._split_heads(self.v_proj(query), bsz)

        prev_r: Optional[Tensor] = None
        prev_vw: Optional[Tensor] = None
        if incremental_state is not None:
            saved = self._get_input_buffer(incremental_state)
            if "prev_key" in saved:
                prev_key, prev_value = saved["prev_key"], saved["prev_value"]
                assert prev_key is not None and prev_value is not None
                k = torch.cat([prev_key, k], dim=2)
                v = torch.cat([prev_value, v], dim=2)
                prev_r = saved.get("prev_bet_r")
                prev_vw = saved.get("prev_bet_vw")
            key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
                key_padding_mask=key_padding_mask,
                prev_key_padding_mask=saved.get("prev_key_padding_mask"),
                batch_size=bsz,
                src_len=k.size(2),
                static_kv=False,
            )
        src_len = k.size(2)
        if incremental_state is not None and tgt_len == 1 and attn_mask is None and key_padding_mask is None:
            # One beam-search step without padding: the newest position sees every cached key.
            # No mask tensors at all (the exact path handles None), a dozen small ops fewer per step.
            allowed = None
        else:
            allowed = self._allowed(tgt_len, src_len, attn_mask, key_padding_mask, query.device)

        fused = (
            self.use_fused_attention
            and incremental_state is None
            and not need_weights
            and not before_softmax
            and not self.capture_attention
            and not self._exact_is_faster(q, src_len)
        )
        if fused:
            out, r_all = self._fused_attention(q, k, v, allowed)
            weights, vw_all = None, None
        else:
            out, weights, r_all, vw_all = self._exact_attention(
                q, k, v, allowed, prev_r, before_softmax, prev_vw
            )
            if before_softmax:
                return weights, v.reshape(bsz * self.num_heads, src_len, self.head_dim)

        if incremental_state is not None:
            saved["prev_key"] = k
            saved["prev_value"] = v
            saved["prev_key_padding_mask"] = key_padding_mask
            if r_all is not None:  # BET(SF): R and V w_h of every key so far, (B, H, S), batch-first
                saved["prev_bet_r"] = r_all
                saved["prev_bet_vw"] = vw_all
            self._set_input_buffer(incremental_state, saved)

        out = out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim)
        out = self.out_proj(out)
        if need_weights and weights is not None:
            weights = weights.transpose(0, 1)  # heads x bsz x tgt x src, as fairseq returns it
            if not need_head_weights:
                weights = weights.mean(dim=0)
        else:
            weights = None
        return out, weights

    # ------------------------------------------------------------------------------------------
    def _split_heads(self, x: Tensor, bsz: int) -> Tensor:
        """(T, B, E) -> (B, H, T, d): batch-first, as the cache must be."""
        return x.view(-1, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def _allowed(self, tgt_len, src_len, attn_mask, key_padding_mask, device) -> Tensor:
        """Boolean (B or 1, 1, T, S): which keys each query may see (fairseq's masks as booleans)."""
        if attn_mask is not None:
            allowed = torch.isfinite(attn_mask).view(1, 1, tgt_len, src_len)
        else:
            # A query block is the last tgt_len positions: causal by position.
            qpos = torch.arange(src_len - tgt_len, src_len, device=device).unsqueeze(1)
            allowed = (torch.arange(src_len, device=device).unsqueeze(0) <= qpos).view(
                1, 1, tgt_len, src_len
            )
        if key_padding_mask is not None:
            allowed = allowed & ~key_padding_mask.bool().view(-1, 1, 1, src_len)
        return allowed

    def _diagonal(self, tgt_len: int, src_len: int, device) -> Tensor:
        """Boolean (T, S): True at each query's own position."""
        offset = src_len - tgt_len
        return torch.arange(src_len, device=device).unsqueeze(0) == (
            torch.arange(tgt_len, device=device).unsqueeze(1) + offset
        )

    def _diagonal_free(self, allowed: Tensor) -> Tensor:
        """Drop the diagonal from each row that has another allowed key (row 0 keeps it)."""
        diag = self._diagonal(allowed.size(-2), allowed.size(-1), allowed.device)
        has_history = (allowed & ~diag).any(dim=-1, keepdim=True)
        return allowed & ~(diag & has_history)

    def _w_columns(self, dtype) -> Tuple[Tensor, Tensor]:
        """w split into its H part and its K part, each (heads or 1, d, 1) for batched matmuls."""
        w = self.bet_w.to(dtype)
        return w[:, : self.head_dim].unsqueeze(-1), w[:, self.head_dim :].unsqueeze(-1)

    def _key_scores_from_value_scores(self, hw: Tensor, k_new: Tensor, w_k: Tensor) -> Tensor:
        """R = sigmoid(H w_h + K w_k), (B, H, T), given H w_h = A (V w_h) as (B, H, T, 1)."""
        return torch.sigmoid(hw + torch.matmul(k_new, w_k)).squeeze(-1)

    def _exact_attention(self, q, k, v, allowed, prev_r, before_softmax, prev_vw=None):
        """Materialised attention. Returns (out, probs, R of all S keys, V w_h of all S keys);
        the last two are None unless bet_sf. ``prev_r``/``prev_vw``: cached values of the first
        S - T keys (incremental decoding), so one step touches V only once, like vanilla."""
        tgt_len, src_len = q.size(2), k.size(2)
        scores = torch.matmul(q, k.transpose(-1, -2))  # D = Q K^T / sqrt(d), (B, H, T, S)
        r, vw = None, None
        if self.mode == "diag_scale":
            diag = self._diagonal(tgt_len, src_len, q.device)
            scores = torch.where(diag, scores * self.diag_scale, scores)
        elif self.mode == "bet_sf":
            first = self._softmax(self._masked(scores, allowed), q.dtype)
            if self.capture_attention:
                self.captured_first_pass = first
            # H w_h = (A V) w_h = A (V w_h): H itself (T x d per head) is never needed.
            w_h, w_k = self._w_columns(q.dtype)
            if prev_vw is None or prev_vw.size(2) != src_len - tgt_len:
                vw = torch.matmul(v, w_h).squeeze(-1)  # (B, H, S)
            else:
                vw = torch.cat([prev_vw, torch.matmul(v[:, :, src_len - tgt_len :], w_h).squeeze(-1)], dim=2)
            hw = torch.matmul(first, vw.unsqueeze(-1))
            r_new = self._key_scores_from_value_scores(hw, k[:, :, src_len - tgt_len :], w_k)
            r = r_new if prev_r is None else torch.cat([prev_r, r_new], dim=2)
            scores = scores * r.unsqueeze(2)  # R_j scales column j
        if allowed is None:
            # one step seeing every key: DiagFreeMask drops the last (own) key unless it is the only one
            if self.masks_diagonal and src_len > 1:
                scores[..., -1] = float("-inf")
        else:
            final_allowed = self._diagonal_free(allowed) if self.masks_diagonal else allowed
            scores = scores.masked_fill(~final_allowed, float("-inf"))
        if before_softmax:
            bsz = q.size(0)
            return None, scores.reshape(bsz * self.num_heads, tgt_len, src_len), r, vw
        probs = self._softmax(scores, q.dtype)
        if self.capture_attention:
            self.captured_attention = probs
        out = torch.matmul(self.dropout_module(probs), v)
        return out, probs, r, vw

    @staticmethod
    def _masked(scores: Tensor, allowed: Optional[Tensor]) -> Tensor:
        return scores if allowed is None else scores.masked_fill(~allowed, float("-inf"))

    @staticmethod
    def _softmax(scores: Tensor, dtype) -> Tensor:
        return F.softmax(scores.float(), dim=-1).to(dtype)

    def _fused_attention(self, q, k, v, allowed):
        dropout_p = self.dropout_module.p if (self.training or self.dropout_module.apply_during_inference) else 0.0
        r_new = None
        if self.mode == "diag_scale":
            # D_ii * c = D_ii + (c - 1) D_ii: an additive bias on the diagonal only.
            tgt_len, src_len = q.size(2), k.size(2)
            diag = self._diagonal(tgt_len, src_len, q.device)
            own = (q * k[:, :, src_len - tgt_len :]).sum(-1)  # (B, H, T) = D_ii
            bias = torch.where(diag, ((self.diag_scale - 1.0) * own).unsqueeze(-1), 0.0)
            bias = bias.masked_fill(~allowed, float("-inf"))
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=1.0)
            return out, r_new
        if self.mode == "bet_sf":
            # First pass on the value scores V w_h (one column per head) instead of V:
            # H w_h = A (V w_h), so the first pass costs about one Q K^T, not a full attention.
            w_h, w_k = self._w_columns(q.dtype)
            hw = self._first_pass_value_scores(q, k, torch.matmul(v, w_h), allowed)
            r_new = self._key_scores_from_value_scores(hw, k, w_k)
            k = k * r_new.unsqueeze(-1)  # (Q K^T) * R == Q (R ⊙ K)^T
        final_allowed = self._diagonal_free(allowed) if self.masks_diagonal else allowed
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=final_allowed, dropout_p=dropout_p, scale=1.0)
        return out, r_new

    @staticmethod
    def _first_pass_value_scores(q, k, vw, allowed, use_sdpa: Optional[bool] = None):
        """softmax(masked Q K^T) (V w_h), (B, H, T, 1), without dropout (the first pass has none).

        On GPUs through SDPA with V w_h zero-padded to 8 columns (what the memory-efficient kernel
        accepts), so no T x S matrix is stored; on CPU SDPA would fall back to its math path with
        extra copies, so the matrix is computed directly there.
        """
        if use_sdpa is None:
            use_sdpa = q.device.type != "cpu"
        if use_sdpa:
            padded = F.pad(vw, (0, 7))
            return F.scaled_dot_product_attention(q, k, padded, attn_mask=allowed, scale=1.0)[..., :1]
        scores = torch.matmul(q, k.transpose(-1, -2)).masked_fill(~allowed, float("-inf"))
        first = F.softmax(scores.float(), dim=-1).to(q.dtype)
        return torch.matmul(first, vw)

    # ------------------------------------------------------------------------------------------
    def upgrade_state_dict_named(self, state_dict, name):
        super().upgrade_state_dict_named(state_dict, name)
        prefix = name + "." if name != "" else ""
        key = prefix + "bet_w"
        if self.mode == "bet_sf":
            if key not in state_dict:
                raise ValueError(
                    f"checkpoint has no {key}: it was not trained with --self-attn-mode bet_sf "
                    "(a vanilla or diagonal-variant model?); build it with the --arch it was trained with"
                )
            if tuple(state_dict[key].shape) != tuple(self.bet_w.shape):
                raise ValueError(
                    f"checkpoint's {key} has shape {tuple(state_dict[key].shape)}, this model expects "
                    f"{tuple(self.bet_w.shape)} (--bet-share-w differs between checkpoint and model)"
                )
        elif key in state_dict:
            raise ValueError(
                f"checkpoint holds {key}: it is a BET(SF) model (--self-attn-mode bet_sf), but this "
                f"model's decoder self-attention mode is {self.mode!r}"
            )
