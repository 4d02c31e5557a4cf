"""Decoder causal self-attention of three published baselines of BET_SPEC Table 2.

``localness``    Yang et al. 2018, "Modeling Localness for Self-Attention Networks": a learned
                 Gaussian bias ``G_ij = -(j - P_i)^2 / (2 sigma_i^2)`` added to the logits, with
                 ``P_i = I_i sigmoid(U_p^T tanh(W_p Q_i))``, ``D_i = I_i sigmoid(U_d^T tanh(W_p Q_i))``,
                 ``sigma_i = D_i / 2``. Q_i is the full (all heads) query of position i, so one
                 window per query is shared by the heads (the paper's W_p in R^{d x d}, U_p, U_d in
                 R^d). Causal: ``I_i = i + 1``, the number of keys query i can see (positions
                 0..i), so P_i lies in the visible prefix and a decoding step needs nothing cached
                 beyond K and V.
``sparse_topk``  Zhao et al. 2019, "Explicit Sparse Transformer": in each row of the scaled logits
                 keep the entries >= the k-th largest allowed one, set the rest to -inf before
                 the softmax. Ties with the k-th value are all kept (the paper's threshold rule,
                 so a row may keep more than k); a row with fewer than k allowed keys keeps them
                 all.
``hopfield``     Ramsauer et al. 2020, "Hopfield Networks is All You Need", the Hopfield layer
                 ``Z = softmax(beta R W_Q W_K^T Y^T) Y W_K W_V`` with R = Y = the layer input:
                 state patterns ``xi = R W_Q``, stored patterns ``K = Y W_K``, pattern projection
                 ``V = (Y W_K) W_V`` (the value projection is applied to the keys). ``steps`` > 1
                 iterates the update in the key space, ``xi <- softmax(beta xi K^T) K``, before the
                 final ``softmax(beta xi K^T) V``; every softmax is causal. With steps=1 and
                 beta = 1/sqrt(d_head) it is standard attention with ``W_V' = W_K W_V``.

All three subclass ``BirdEyeMultiheadAttention`` (its mode stays ``vanilla``) for its batch-first
head split, mask and capture helpers; ``bird_eye_self_attentions(model)`` finds them, and
``capture_attention`` works as there. Only the exact (materialised) attention path exists. The
cache is fairseq's batch-first K and V, so ``reorder_incremental_state`` serves beam search.
"""

import math
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from fairseq.modules.multihead_attention import MultiheadAttention

from .bird_eye_attention import BirdEyeMultiheadAttention, IncrementalState

BASELINES = ("localness", "sparse_topk", "hopfield")
DEFAULT_SPARSE_TOPK = 8
DEFAULT_HOPFIELD_STEPS = 1
# Numerical guard of the localness window: sigma below this would overflow the bias.
MIN_LOCALNESS_SIGMA = 1e-4


def validate_baseline_settings(baseline, sparse_topk=None, hopfield_beta=None, hopfield_steps=None) -> dict:
    """Resolve the defaults of ``baseline`` and raise a ValueError naming any bad option."""
    if baseline not in BASELINES:
        raise ValueError(
            f"--self-attn-baseline: unknown baseline {baseline!r}; choose one of {', '.join(BASELINES)}"
        )
    if baseline != "sparse_topk" and sparse_topk is not None:
        raise ValueError(f"--sparse-topk only applies to --self-attn-baseline sparse_topk (baseline is {baseline!r})")
    if baseline != "hopfield" and (hopfield_beta is not None or hopfield_steps is not None):
        raise ValueError(
            f"--hopfield-beta and --hopfield-steps only apply to --self-attn-baseline hopfield "
            f"(baseline is {baseline!r})"
        )
    settings = dict(baseline=baseline)
    if baseline == "sparse_topk":
        k = DEFAULT_SPARSE_TOPK if sparse_topk is None else sparse_topk
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(
                f"--sparse-topk must be a whole number >= 1 (the logits kept per row), got {sparse_topk!r}"
            )
        settings["sparse_topk"] = k
    if baseline == "hopfield":
        steps = DEFAULT_HOPFIELD_STEPS if hopfield_steps is None else hopfield_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"--hopfield-steps must be a whole number >= 1 (update steps), got {hopfield_steps!r}")
        if hopfield_beta is not None:
            try:
                beta = float(hopfield_beta)
            except (TypeError, ValueError):
                raise ValueError(f"--hopfield-beta must be a number, got {hopfield_beta!r}") from None
            if not math.isfinite(beta) or beta <= 0:
                raise ValueError(
                    f"--hopfield-beta must be a finite number > 0 (the inverse temperature), got {beta}"
                )
            hopfield_beta = beta
        settings["hopfield_beta"] = hopfield_beta  # None: 1/sqrt(head_dim)
        settings["hopfield_steps"] = steps
    return settings


class BaselineSelfAttention(BirdEyeMultiheadAttention):
    """Shared forward of the baselines: project, extend the cache, ``_logits``, softmax, ``A V``.

    Subclasses implement ``_logits(q, k, allowed, q_full, positions)``: the final masked logits
    ``(B, H, T, S)``, with -inf where a key is not used. ``q`` is unscaled, ``q_full`` is the
    all-heads query ``(T, B, E)`` and ``positions`` the absolute position of each query ``(T,)``.
    """

    baseline = None

    def __init__(self, embed_dim, num_heads, **kwargs):
        super().__init__(embed_dim, num_heads, mode="vanilla", **kwargs)
        if not self.self_attention:
            raise ValueError(f"--self-attn-baseline {self.baseline} needs self_attention=True")
        if self.bias_k is not None or self.add_zero_attn:
            raise ValueError(f"--self-attn-baseline {self.baseline} does not support add_bias_kv/add_zero_attn")
        self.use_fused_attention = False  # only the exact path exists here

    def extra_repr(self):
        return f"baseline={self.baseline}"

    def _values(self, query: Tensor, keys: Tensor) -> Tensor:
        """The value projection (T, B, E); Hopfield projects the keys instead of the input."""
        return self.v_proj(query)

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
        if static_kv:
            raise ValueError(f"{type(self).__name__} is a self-attention and does not take static_kv")
        need_weights = need_weights or need_head_weights
        tgt_len, bsz, embed_dim = query.size()
        q_full = self.q_proj(query)
        k_full = self.k_proj(query)
        q = self._split_heads(q_full, bsz)
        k = self._split_heads(k_full, bsz)
        v = self._split_heads(self._values(query, k_full), bsz)

        if incremental_state is not None:
            saved = self._get_input_buffer(incremental_state)
            if "prev_key" in saved:
                prev_key, prev_value = saved["prev_key"], saved["prev_value"]
                assert prev_key is not None and prev_value is not None
                k = torch.cat([prev_key, k], dim=2)
                v = torch.cat([prev_value, v], dim=2)
            key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
                key_padding_mask=key_padding_mask,
                prev_key_padding_mask=saved.get("prev_key_padding_mask"),
                batch_size=bsz,
                src_len=k.size(2),
                static_kv=False,
            )
        src_len = k.size(2)
        allowed = self._allowed(tgt_len, src_len, attn_mask, key_padding_mask, query.device)
        positions = torch.arange(src_len - tgt_len, src_len, device=query.device)
        logits = self._logits(q, k, allowed, q_full, positions)
        if before_softmax:
            return logits.reshape(bsz * self.num_heads, tgt_len, src_len), v.reshape(
                bsz * self.num_heads, src_len, self.head_dim
            )
        probs = self._softmax(logits, q.dtype)
        if self.capture_attention:
            self.captured_attention = probs
        out = torch.matmul(self.dropout_module(probs), v)

        if incremental_state is not None:
            saved["prev_key"] = k
            saved["prev_value"] = v
            saved["prev_key_padding_mask"] = key_padding_mask
            self._set_input_buffer(incremental_state, saved)

        out = self.out_proj(out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim))
        weights = None
        if need_weights:
            weights = probs.transpose(0, 1)  # heads x bsz x tgt x src, as fairseq returns it
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return out, weights

    def _logits(self, q, k, allowed, q_full, positions) -> Tensor:
        raise NotImplementedError

    def _scaled_logits(self, q, k, allowed) -> Tensor:
        return torch.matmul(q * self.scaling, k.transpose(-1, -2)).masked_fill(~allowed, float("-inf"))

    def upgrade_state_dict_named(self, state_dict, name):
        MultiheadAttention.upgrade_state_dict_named(self, state_dict, name)
        prefix = name + "." if name != "" else ""
        own = {n for n, _ in self.named_parameters()}
        for extra in ("bet_w", "localness_w_p.weight", "localness_u.weight"):
            if prefix + extra in state_dict and extra not in own:
                raise ValueError(
                    f"checkpoint holds {prefix + extra}, which a {self.baseline} self-attention does not have: "
                    "build the model with the --arch it was trained with"
                )
            if extra in own and prefix + extra not in state_dict:
                raise ValueError(
                    f"checkpoint has no {prefix + extra}: it was not trained with --self-attn-baseline "
                    f"{self.baseline}; build the model with the --arch it was trained with"
                )


class LocalnessSelfAttention(BaselineSelfAttention):
    """Yang et al. 2018: a query-predicted Gaussian window, one per query, shared by the heads."""

    baseline = "localness"

    def __init__(self, embed_dim, num_heads, **kwargs):
        super().__init__(embed_dim, num_heads, **kwargs)
        self.localness_w_p = nn.Linear(embed_dim, embed_dim, bias=False)  # W_p, shared by P and D
        self.localness_u = nn.Linear(embed_dim, 2, bias=False)  # rows: U_p, U_d
        nn.init.xavier_uniform_(self.localness_w_p.weight)
        nn.init.xavier_uniform_(self.localness_u.weight)

    def window(self, q_full: Tensor, positions: Tensor) -> Tuple[Tensor, Tensor]:
        """Centre P and window D per query, (B, T) each, for queries at ``positions``."""
        visible = (positions + 1).to(q_full.dtype).unsqueeze(1)  # I_i = i + 1, (T, 1)
        scores = torch.sigmoid(self.localness_u(torch.tanh(self.localness_w_p(q_full))))  # (T, B, 2)
        centre = visible * scores[..., 0]
        width = visible * scores[..., 1]
        return centre.transpose(0, 1), width.transpose(0, 1)

    def _logits(self, q, k, allowed, q_full, positions):
        centre, width = self.window(q_full, positions)
        sigma = (width / 2).clamp_min(MIN_LOCALNESS_SIGMA)
        keys = torch.arange(k.size(2), device=k.device, dtype=centre.dtype)
        bias = -((keys.view(1, 1, -1) - centre.unsqueeze(-1)) ** 2) / (2 * sigma.unsqueeze(-1) ** 2)  # (B, T, S)
        logits = torch.matmul(q * self.scaling, k.transpose(-1, -2)) + bias.unsqueeze(1).to(q.dtype)
        return logits.masked_fill(~allowed, float("-inf"))


def top_k_keep(logits: Tensor, allowed: Tensor, k: int) -> Tensor:
    """Boolean mask of the logits each row keeps: allowed and >= the row's k-th largest allowed
    logit (ties all kept); every allowed entry when a row has fewer than k."""
    masked = logits.masked_fill(~allowed, float("-inf"))
    kk = min(k, masked.size(-1))
    kth = masked.topk(kk, dim=-1).values[..., -1:]  # -inf when fewer than k are allowed
    return allowed & (masked >= kth)


class SparseTopKSelfAttention(BaselineSelfAttention):
    """Zhao et al. 2019: only the top-k logits of each row take part in the softmax."""

    baseline = "sparse_topk"

    def __init__(self, embed_dim, num_heads, sparse_topk: int = DEFAULT_SPARSE_TOPK, **kwargs):
        super().__init__(embed_dim, num_heads, **kwargs)
        self.sparse_topk = validate_baseline_settings("sparse_topk", sparse_topk=sparse_topk)["sparse_topk"]

    def extra_repr(self):
        return f"baseline=sparse_topk, k={self.sparse_topk}"

    def _logits(self, q, k, allowed, q_full, positions):
        logits = self._scaled_logits(q, k, allowed)
        keep = top_k_keep(logits.detach(), allowed, self.sparse_topk)
        return logits.masked_fill(~keep, float("-inf"))


class HopfieldSelfAttention(BaselineSelfAttention):
    """Ramsauer et al. 2020: the Hopfield layer as a causal self-attention."""

    baseline = "hopfield"

    def __init__(self, embed_dim, num_heads, hopfield_beta: Optional[float] = None,
                 hopfield_steps: int = DEFAULT_HOPFIELD_STEPS, **kwargs):
        super().__init__(embed_dim, num_heads, **kwargs)
        settings = validate_baseline_settings("hopfield", hopfield_beta=hopfield_beta, hopfield_steps=hopfield_steps)
        self.hopfield_beta = settings["hopfield_beta"] or 1.0 / math.sqrt(self.head_dim)
        self.hopfield_steps = settings["hopfield_steps"]

    def extra_repr(self):
        return f"baseline=hopfield, beta={self.hopfield_beta:g}, steps={self.hopfield_steps}"

    def _values(self, query, keys):
        return self.v_proj(keys)  # pattern projection Y W_K W_V

    def _logits(self, q, k, allowed, q_full, positions):
        xi = q  # state patterns R W_Q
        kt = k.transpose(-1, -2)
        for _ in range(self.hopfield_steps - 1):
            logits = (self.hopfield_beta * torch.matmul(xi, kt)).masked_fill(~allowed, float("-inf"))
            probs = self._softmax(logits, q.dtype)
            xi = torch.matmul(probs, k)  # xi <- softmax(beta xi K^T) K
        return (self.hopfield_beta * torch.matmul(xi, kt)).masked_fill(~allowed, float("-inf"))


BASELINE_MODULES = {
    "localness": LocalnessSelfAttention,
    "sparse_topk": SparseTopKSelfAttention,
    "hopfield": HopfieldSelfAttention,
}


def build_baseline_attention(embed_dim, num_heads, baseline, sparse_topk=None, hopfield_beta=None,
                             hopfield_steps=None, **kwargs) -> BaselineSelfAttention:
    """The baseline's module from validated settings (see ``validate_baseline_settings``)."""
    settings = validate_baseline_settings(baseline, sparse_topk, hopfield_beta, hopfield_steps)
    settings.pop("baseline")
    return BASELINE_MODULES[baseline](embed_dim, num_heads, **settings, **kwargs)
