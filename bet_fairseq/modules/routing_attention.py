"""Routing attention (Roy et al. 2021, "Efficient Content-Based Sparse Attention with Routing
Transformers") for a decoder's causal self-attention, as a dense-masked fairseq
``MultiheadAttention``.

Heads are of two kinds, as in the paper's LM models, which mix local and routing heads:

``local``   the first ``num_heads - routing_heads`` heads: query i sees keys i-window < j <= i.
``routing`` the last ``routing_heads`` heads: each head keeps ``num_clusters`` unit-norm centroids
            (a buffer, saved in the checkpoint, never trained by gradient). Queries and keys are
            layer-normalised (no affine) and unit-normalised, then assigned to the nearest centroid
            (largest cosine); query i sees key j <= i only when both fall into the same cluster.
            A query always sees itself, so no row is empty (its own key may be in another cluster).

Centroids are updated in training, after the forward has used them (so a forward stays causal):
``mu_c <- normalize(decay * mu_c + (1 - decay) * mean of the routing vectors (queries and keys of the
batch, padding excluded) assigned to c)``; a cluster with no vector keeps its centroid. The paper
writes the update with sums of the assigned vectors; the mean keeps the update bounded for any batch
size. On the very first training batch the centroids are initialised by a few spherical k-means
iterations on that batch (as fairseq's ``modules/kmeans_attention.py`` does). Under
``torch.distributed`` the sums and counts are all-reduced so every replica keeps the same centroids.

The implementation materialises the (B, H, T, S) mask: exact and simple, and fine at the sizes of
this project (it is not the paper's O(n^1.5) sorted-cluster implementation). Incremental decoding
caches K and V batch-first like fairseq; cached keys are re-routed with the current centroids
(fixed at inference).
"""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from fairseq.modules.multihead_attention import MultiheadAttention

KMEANS_INIT_ITERS = 10


def validate_routing_settings(num_heads, num_clusters, window, routing_heads, ema_decay):
    """Raise a ValueError naming the bad option; returns the resolved number of routing heads."""
    if routing_heads is None:
        routing_heads = num_heads // 2
    checks = (
        (isinstance(num_clusters, int) and num_clusters >= 1, f"--routing-clusters must be an integer >= 1, got {num_clusters!r}"),
        (isinstance(window, int) and window >= 1, f"--routing-window must be an integer >= 1 (tokens a local head sees, itself included), got {window!r}"),
        (isinstance(routing_heads, int) and 0 <= routing_heads <= num_heads,
         f"--routing-heads must be an integer between 0 and the number of heads ({num_heads}), got {routing_heads!r}"),
    )
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
    try:
        ema_decay = float(ema_decay)
    except (TypeError, ValueError):
        raise ValueError(f"--routing-ema-decay must be a number in [0, 1), got {ema_decay!r}") from None
    if not (0.0 <= ema_decay < 1.0):
        raise ValueError(f"--routing-ema-decay must be a number in [0, 1), got {ema_decay}")
    return routing_heads, ema_decay


def routing_vectors(x: Tensor) -> Tensor:
    """Layer-normalise (no affine) and unit-normalise the last dimension (at least in float32)."""
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    return F.normalize(F.layer_norm(x, x.shape[-1:]), dim=-1)


def nearest_centroid(x: Tensor, centroids: Tensor) -> Tensor:
    """x (B, H, L, d) unit vectors, centroids (H, C, d) -> cluster index (B, H, L)."""
    return torch.einsum("bhld,hcd->bhlc", x, centroids.to(x.dtype)).argmax(dim=-1)


class RoutingMultiheadAttention(MultiheadAttention):
    """Causal self-attention with local heads and k-means routing heads (see the module docstring).

    ``capture_attention``: when set, every forward stores the probabilities it used (per head, before
    dropout) in ``captured_attention`` (``(bsz, heads, tgt, src)``), as ``BirdEyeMultiheadAttention``.
    """

    def __init__(self, embed_dim, num_heads, num_clusters=8, window=128, routing_heads=None,
                 ema_decay=0.999, **kwargs):
        kwargs.setdefault("self_attention", True)
        super().__init__(embed_dim, num_heads, **kwargs)
        if not self.self_attention or self.bias_k is not None or self.add_zero_attn:
            raise ValueError("routing attention is a self-attention without add_bias_kv/add_zero_attn")
        self.routing_heads, self.ema_decay = validate_routing_settings(
            num_heads, num_clusters, window, routing_heads, ema_decay)
        self.local_heads = num_heads - self.routing_heads
        self.num_clusters = num_clusters
        self.window = window
        self.register_buffer(
            "centroids", F.normalize(torch.randn(self.routing_heads, num_clusters, self.head_dim), dim=-1))
        self.register_buffer("centroids_initialized", torch.tensor(False))
        self.capture_attention = False
        self.captured_attention: Optional[Tensor] = None
        self.use_fused_attention = True

    def extra_repr(self):
        return (f"local_heads={self.local_heads}, window={self.window}, routing_heads={self.routing_heads}, "
                f"clusters={self.num_clusters}, ema_decay={self.ema_decay}")

    # ------------------------------------------------------------------------------------------
    def forward(self, query, key, value, key_padding_mask=None, incremental_state=None, need_weights=True,
                static_kv=False, attn_mask=None, before_softmax=False, need_head_weights=False
                ) -> Tuple[Tensor, Optional[Tensor]]:
        if static_kv or before_softmax:
            raise ValueError("RoutingMultiheadAttention supports neither static_kv nor before_softmax")
        need_weights = need_weights or need_head_weights
        tgt_len, bsz, embed_dim = query.size()
        split = lambda x: x.view(-1, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)  # noqa: E731
        q_raw, k_new, v = split(self.q_proj(query)), split(self.k_proj(query)), split(self.v_proj(query))
        k = k_new
        if incremental_state is not None:
            saved = self._get_input_buffer(incremental_state)
            if "prev_key" in saved:
                k = torch.cat([saved["prev_key"], k], dim=2)
                v = torch.cat([saved["prev_value"], v], dim=2)
            key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
                key_padding_mask=key_padding_mask, prev_key_padding_mask=saved.get("prev_key_padding_mask"),
                batch_size=bsz, src_len=k.size(2), static_kv=False)
            saved.update(prev_key=k, prev_value=v, prev_key_padding_mask=key_padding_mask)
            self._set_input_buffer(incremental_state, saved)
        src_len = k.size(2)
        new_padding = None if key_padding_mask is None else key_padding_mask[:, src_len - tgt_len:].bool()
        allowed = self.allowed_keys(q_raw, k, attn_mask, key_padding_mask, new_padding)
        q = q_raw * self.scaling

        if self.use_fused_attention and not need_weights and not self.capture_attention:
            p = self.dropout_module.p if (self.training or self.dropout_module.apply_during_inference) else 0.0
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=p, scale=1.0)
            weights = None
        else:
            scores = torch.matmul(q, k.transpose(-1, -2)).masked_fill(~allowed, float("-inf"))
            weights = F.softmax(scores.float(), dim=-1).to(q.dtype)
            if self.capture_attention:
                self.captured_attention = weights
            out = torch.matmul(self.dropout_module(weights), v)
        out = self.out_proj(out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim))
        if need_weights:
            weights = weights.transpose(0, 1)  # heads x bsz x tgt x src, as fairseq returns it
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return out, (weights if need_weights else None)

    # ------------------------------------------------------------------------------------------
    def allowed_keys(self, q, k, attn_mask=None, key_padding_mask=None, query_padding=None) -> Tensor:
        """Boolean (B, H, T, S): which keys each query may see. q (B, H, T, d) is the last T of the
        S positions of k (B, H, S, d). In training this also updates the centroids (after routing)."""
        bsz, _, tgt_len, _ = q.shape
        src_len = k.size(2)
        device = q.device
        qpos = torch.arange(src_len - tgt_len, src_len, device=device).unsqueeze(1)
        kpos = torch.arange(src_len, device=device).unsqueeze(0)
        if attn_mask is not None:
            causal = torch.isfinite(attn_mask).view(tgt_len, src_len)
        else:
            causal = kpos <= qpos
        diag = kpos == qpos
        masks = []
        if self.local_heads:
            local = causal & (qpos - kpos < self.window)
            masks.append(local.expand(bsz, self.local_heads, tgt_len, src_len))
        if self.routing_heads:
            rq = routing_vectors(q[:, self.local_heads:])
            rk = routing_vectors(k[:, self.local_heads:])
            if self.training and not bool(self.centroids_initialized):
                self._init_centroids(rq, rk[:, :, src_len - tgt_len:], query_padding)
            cq, ck = nearest_centroid(rq, self.centroids), nearest_centroid(rk, self.centroids)
            same = (cq.unsqueeze(-1) == ck.unsqueeze(-2)) | diag
            masks.append(same & causal)
            if self.training:
                self._update_centroids(rq, cq, rk[:, :, src_len - tgt_len:], ck[:, :, src_len - tgt_len:],
                                       query_padding)
        allowed = torch.cat(masks, dim=1)
        if key_padding_mask is not None:
            allowed = allowed & ~key_padding_mask.bool().view(bsz, 1, 1, src_len)
        # A row left empty (a padded query whose window holds only padding) keeps its diagonal,
        # so the softmax never sees an all -inf row (its output is never scored).
        return allowed | (diag & ~allowed.any(dim=-1, keepdim=True))

    # ------------------------------------------------------------------------------------------
    def _valid_vectors(self, rq, cq, rk, ck, padding):
        """Stack the queries and (new) keys of the routing heads: (H, N, d) vectors, (H, N) clusters."""
        heads = rq.size(1)
        vec = torch.cat([rq, rk], dim=2)  # (B, H, 2T, d)
        idx = None if cq is None else torch.cat([cq, ck], dim=2)
        if padding is not None:
            keep = ~torch.cat([padding, padding], dim=1)  # (B, 2T)
            vec = vec.permute(1, 0, 2, 3)[:, keep]  # (H, N, d)
            idx = None if idx is None else idx.permute(1, 0, 2)[:, keep]
        else:
            vec = vec.permute(1, 0, 2, 3).reshape(heads, -1, vec.size(-1))
            idx = None if idx is None else idx.permute(1, 0, 2).reshape(heads, -1)
        return vec, idx

    @staticmethod
    def _cluster_sums(vec, idx, num_clusters):
        heads, _, dim = vec.shape
        sums = vec.new_zeros(heads, num_clusters, dim).scatter_add_(1, idx.unsqueeze(-1).expand_as(vec), vec)
        counts = vec.new_zeros(heads, num_clusters).scatter_add_(1, idx, torch.ones_like(idx, dtype=vec.dtype))
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(sums)
            torch.distributed.all_reduce(counts)
        return sums, counts

    @torch.no_grad()
    def _update_centroids(self, rq, cq, rk, ck, padding):
        vec, idx = self._valid_vectors(rq, cq, rk, ck, padding)
        sums, counts = self._cluster_sums(vec, idx, self.num_clusters)
        means = sums / counts.clamp(min=1).unsqueeze(-1)
        updated = F.normalize(self.ema_decay * self.centroids + (1 - self.ema_decay) * means, dim=-1)
        self.centroids.copy_(torch.where((counts > 0).unsqueeze(-1), updated, self.centroids))

    @torch.no_grad()
    def _init_centroids(self, rq, rk, padding):
        vec, _ = self._valid_vectors(rq, None, rk, None, padding)
        heads, n, _ = vec.shape
        if n == 0:
            return
        pick = torch.randperm(n, device=vec.device)[: self.num_clusters]
        if pick.numel() < self.num_clusters:
            pick = torch.randint(0, n, (self.num_clusters,), device=vec.device)
        centroids = vec[:, pick].clone()
        for _ in range(KMEANS_INIT_ITERS):
            idx = torch.einsum("hnd,hcd->hnc", vec, centroids).argmax(-1)
            sums, counts = self._cluster_sums(vec, idx, self.num_clusters)
            centroids = torch.where((counts > 0).unsqueeze(-1), F.normalize(sums, dim=-1), centroids)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.broadcast(centroids, src=0)
        self.centroids.copy_(centroids)
        self.centroids_initialized.fill_(True)
