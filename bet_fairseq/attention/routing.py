"""Routing attention (Roy et al. 2021, "Efficient Content-Based Sparse Attention with Routing
Transformers"), dense-masked.

Heads are of two kinds, as in the paper's LM models, which mix local and routing heads:

``local``   the first ``num_heads - routing_heads`` heads: query i sees keys i-window < j <= i.
``routing`` the last ``routing_heads`` heads: each head keeps ``num_clusters`` unit-norm centroids
            (a buffer, saved in the checkpoint, never trained by gradient). Queries and keys are
            layer-normalised (no affine) and unit-normalised, then assigned to the nearest centroid;
            query i sees key j <= i only when both fall into the same cluster. A query always sees
            itself (its own key may be in another cluster).

Centroids are updated in training *after* the forward has routed with them, so a forward stays causal:
``mu_c <- normalize(decay * mu_c + (1 - decay) * mean of the routing vectors assigned to c)`` (queries
and new keys of the batch, padding excluded); a cluster with no vector keeps its centroid. The first
training batch is routed with the random initial centroids and then initialises them by a few spherical
k-means iterations on that batch (initialising first and routing that batch with them would let future
positions decide which past keys a query sees). Under ``torch.distributed`` the sums and counts are
all-reduced so every replica keeps the same centroids. The (B, H, T, S) mask is materialised (not the
paper's O(n^1.5) sorted-cluster kernel). Incremental decoding re-routes cached keys with the current
centroids (fixed at inference).
"""

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F

from fairseq.dataclass import FairseqDataclass

from ..core.functional import nearest_centroid, routing_vectors
from ..core.masks import own_position
from . import SelfAttentionVariant, register_variant

KMEANS_INIT_ITERS = 10


@dataclass
class RoutingOptions(FairseqDataclass):
    routing_clusters: int = field(default=16, metadata={"help": "routing heads: k-means centroids per head"})
    routing_window: int = field(
        default=128, metadata={"help": "local heads: each token sees this many tokens (itself included)"})
    routing_heads: Optional[int] = field(
        default=None, metadata={"help": "routing heads per layer (the rest are local); default: half the heads"})
    routing_ema_decay: float = field(
        default=0.999, metadata={"help": "centroid update: mu <- decay*mu + (1-decay)*mean(assigned), in [0, 1)"})


@register_variant("routing", options=RoutingOptions)
class RoutingSelfAttention(SelfAttentionVariant):
    @classmethod
    def check_options(cls, options, num_heads):
        clusters, window, heads = options.routing_clusters, options.routing_window, options.routing_heads
        heads = num_heads // 2 if heads is None else heads
        checks = (
            (isinstance(clusters, int) and clusters >= 1, f"--routing-clusters must be an integer >= 1, got {clusters!r}"),
            (isinstance(window, int) and window >= 1,
             f"--routing-window must be an integer >= 1 (tokens a local head sees, itself included), got {window!r}"),
            (isinstance(heads, int) and 0 <= heads <= num_heads,
             f"--routing-heads must be an integer between 0 and the number of heads ({num_heads}), got {heads!r}"),
        )
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        try:
            decay = float(options.routing_ema_decay)
        except (TypeError, ValueError):
            raise ValueError(f"--routing-ema-decay must be a number in [0, 1), got {options.routing_ema_decay!r}") from None
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"--routing-ema-decay must be a number in [0, 1), got {decay}")

    def __init__(self, embed_dim, num_heads, options=None, **kwargs):
        super().__init__(embed_dim, num_heads, options=options, **kwargs)
        o = self.options
        self.routing_heads = num_heads // 2 if o.routing_heads is None else o.routing_heads
        self.local_heads = num_heads - self.routing_heads
        self.num_clusters, self.window, self.ema_decay = o.routing_clusters, o.routing_window, float(o.routing_ema_decay)
        self.register_buffer(
            "centroids", F.normalize(torch.randn(self.routing_heads, self.num_clusters, self.head_dim), dim=-1))
        self.register_buffer("centroids_initialized", torch.tensor(False))

    def restrict(self, q, k, allowed):
        bsz, _, tgt_len, _ = q.shape
        src_len = k.size(2)
        diag = own_position(tgt_len, src_len, q.device)
        # A query is padding exactly when its own key is masked (causal masks always allow it).
        query_padding = None
        if allowed.size(0) == bsz:
            query_padding = ~allowed[:, 0, torch.arange(tgt_len, device=q.device), torch.arange(
                src_len - tgt_len, src_len, device=q.device)]
            if not query_padding.any():
                query_padding = None
        masks = []
        if self.local_heads:
            qpos = torch.arange(src_len - tgt_len, src_len, device=q.device).unsqueeze(1)
            near = (qpos - torch.arange(src_len, device=q.device).unsqueeze(0)) < self.window
            masks.append((allowed & near).expand(bsz, self.local_heads, tgt_len, src_len))
        if self.routing_heads:
            rq = routing_vectors(q[:, self.local_heads:] / self.scaling)
            rk = routing_vectors(k[:, self.local_heads:])
            cq, ck = nearest_centroid(rq, self.centroids), nearest_centroid(rk, self.centroids)
            same = (cq.unsqueeze(-1) == ck.unsqueeze(-2)) | diag
            masks.append((same & allowed).expand(bsz, self.routing_heads, tgt_len, src_len))
            if self.training:  # only after routing: this batch never sees centroids fitted to it
                new_keys = slice(src_len - tgt_len, src_len)
                if bool(self.centroids_initialized):
                    self._update_centroids(rq, cq, rk[:, :, new_keys], ck[:, :, new_keys], query_padding)
                else:
                    self._init_centroids(rq, rk[:, :, new_keys], query_padding)
        return torch.cat(masks, dim=1)

    # ------------------------------------------------------------------------------- centroids
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
