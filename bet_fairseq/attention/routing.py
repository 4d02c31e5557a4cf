"""Routing attention (Roy et al. 2021, "Efficient Content-Based Sparse Attention with Routing
Transformers"), dense-masked.

Heads are of two kinds, as in the paper's LM models, which mix local and routing heads:

``local``   the first ``num_heads - routing_heads`` heads: query i sees keys i-window < j <= i.
``routing`` the last ``routing_heads`` heads: each head keeps ``num_clusters`` unit-norm centroids (a
            buffer, saved in the checkpoint, never trained by gradient). Routing vectors are
            layer-normalised (no affine) and unit-normalised, then assigned to the nearest centroid;
            query i sees key j <= i only when both fall into the same cluster.

Keys of the routing heads are their queries (one projection, ``q_proj``, as the reference code's
decoders, ``share_qk``): a token's query and key then share one routing vector and one cluster, so a
query always sees itself. ``--routing-separate-qk`` keeps version 0.1's routing: keys from ``k_proj``,
queries and keys routed separately, and a forced link of each query to its own key.

The k-means commitment term ``||r - mu(r)||^2`` (``--routing-commitment``, the reference code's beta)
pulls the routing vectors towards their centroids. fairseq's criterions add no auxiliary loss, so it
enters as a gradient: the routing vectors pass through an identity whose backward adds that of
``beta * sum over tokens of mean_heads ||r - mu(r)||^2`` (``core.baselines.with_commitment_gradient``);
the trainer's division by the sample size (tokens) makes it the per-token mean, any criterion keeps
working, and the reported loss and perplexity stay the criterion's own.

Centroids are updated in training *after* the forward has routed with them, so a forward stays causal:
``mu_c <- normalize(decay * mu_c + (1 - decay) * mean of the routing vectors assigned to c)`` (the
batch's routing vectors, padding excluded); a cluster with no vector keeps its centroid. The first
training batch is routed with the random initial centroids and then initialises them by a few spherical
k-means iterations on that batch (initialising first and routing that batch with them would let future
positions decide which past keys a query sees); it adds no commitment gradient. Under
``torch.distributed`` the sums and counts are all-reduced so every replica keeps the same centroids. The
(B, H, T, S) mask is materialised (not the paper's O(n^1.5) sorted-cluster kernel). Incremental decoding
re-routes cached keys with the current centroids (fixed at inference).
"""

import math
from dataclasses import dataclass, field
from typing import List, Optional

import torch
import torch.nn.functional as F

from fairseq.dataclass import FairseqDataclass

from ..option_history import option_added
from ..core.baselines import nearest_centroid, routing_vectors, with_commitment_gradient
from ..core.masks import own_position
from . import SelfAttentionVariant, register_variant
from ..errors import InputError

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
    # (checkpoints from before these two options routed separate keys and had no commitment term)
    routing_separate_qk: bool = field(
        default=False, metadata={"help": "routing heads: keys from their own projection, routed separately, each "
                                         "query linked to itself (version 0.1); default: keys are the queries",
                                 **option_added("0.2", before=True)})
    routing_commitment: float = field(
        default=1e-4, metadata={"help": "routing heads: weight of the k-means commitment term ||r - mu(r)||^2 "
                                        "(per token, mean over routing heads), >= 0; 0 turns it off",
                                **option_added("0.2", before=0.0)})


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
            (isinstance(options.routing_separate_qk, bool),
             f"--routing-separate-qk is a flag (True or False), got {options.routing_separate_qk!r}"),
        )
        for ok, message in checks:
            if not ok:
                raise InputError(message)
        try:
            decay = float(options.routing_ema_decay)
        except (TypeError, ValueError):
            raise InputError(f"--routing-ema-decay must be a number in [0, 1), got {options.routing_ema_decay!r}") from None
        if not 0.0 <= decay < 1.0:
            raise InputError(f"--routing-ema-decay must be a number in [0, 1), got {decay}")
        try:
            commitment = float(options.routing_commitment)
        except (TypeError, ValueError):
            commitment = float("nan")
        if not (math.isfinite(commitment) and commitment >= 0.0):
            raise InputError(f"--routing-commitment must be a finite number >= 0, got {options.routing_commitment!r}")

    def __init__(self, embed_dim, num_heads, options=None, **kwargs):
        super().__init__(embed_dim, num_heads, options=options, **kwargs)
        o = self.options
        self.routing_heads = num_heads // 2 if o.routing_heads is None else o.routing_heads
        self.local_heads = num_heads - self.routing_heads
        self.num_clusters, self.window, self.ema_decay = o.routing_clusters, o.routing_window, float(o.routing_ema_decay)
        self.shared_qk = not o.routing_separate_qk
        self.commitment = float(o.routing_commitment)
        self.register_buffer(
            "centroids", F.normalize(torch.randn(self.routing_heads, self.num_clusters, self.head_dim), dim=-1))
        self.register_buffer("centroids_initialized", torch.tensor(False))

    def project(self, query, context):
        """Shared Q/K: the routing heads' keys are ``q_proj`` of the context, unscaled (``k_proj``'s rows
        of those heads stay in the model, unused, so that checkpoints keep one shape)."""
        if not (self.shared_qk and self.routing_heads):
            return super().project(query, context)
        local = self.local_heads * self.head_dim
        q = self.q_proj(query)
        shared = (q if context is query else self.q_proj(context))[..., local:]
        bias = self.k_proj.bias
        k_local = F.linear(context, self.k_proj.weight[:local], None if bias is None else bias[:local])
        k = self.split_heads(torch.cat([k_local, shared], dim=-1))
        return self.split_heads(q * self.scaling), k, self.split_heads(self.v_proj(context))

    def attend(self, q, k, v, allowed, cache, exact):
        if self.commitment > 0 and self.routing_heads and self.training and torch.is_grad_enabled() \
                and bool(self.centroids_initialized):
            if q.dtype == torch.float16:
                raise InputError("--routing-commitment adds its gradient outside the loss, which --fp16 / --amp "
                                 "loss scaling would not scale: train with --bf16 or fp32, or --routing-commitment 0")
            bsz, tgt_len, src_len = q.size(0), q.size(2), k.size(2)
            keep = self._batch_tokens(allowed, bsz, tgt_len, src_len)
            centroids = self.centroids.clone()  # the ones this forward routes with (updated before the backward)
            k = with_commitment_gradient(k, centroids, keep, self.commitment, first_head=self.local_heads)
            if not self.shared_qk:
                q = with_commitment_gradient(q, centroids, None if keep is None else keep[:, src_len - tgt_len:],
                                             self.commitment, first_head=self.local_heads, divisor=self.scaling)
        return super().attend(q, k, v, allowed, cache, exact)

    def restrict(self, q, k, allowed):
        bsz, _, tgt_len, _ = q.shape
        src_len = k.size(2)
        query_padding = self._query_padding(allowed, bsz, tgt_len, src_len)
        masks = []
        if self.local_heads:
            qpos = torch.arange(src_len - tgt_len, src_len, device=q.device).unsqueeze(1)
            near = (qpos - torch.arange(src_len, device=q.device).unsqueeze(0)) < self.window
            masks.append((allowed & near).expand(bsz, self.local_heads, tgt_len, src_len))
        if self.routing_heads:
            new_keys = slice(src_len - tgt_len, src_len)
            rk = routing_vectors(k[:, self.local_heads:])
            ck = nearest_centroid(rk, self.centroids)
            if self.shared_qk:  # a query's routing vector is its own key's
                rq, cq = rk[:, :, new_keys], ck[:, :, new_keys]
                same = cq.unsqueeze(-1) == ck.unsqueeze(-2)
                vectors, clusters = [rq], [cq]
            else:
                rq = routing_vectors(q[:, self.local_heads:] / self.scaling)
                cq = nearest_centroid(rq, self.centroids)
                same = (cq.unsqueeze(-1) == ck.unsqueeze(-2)) | own_position(tgt_len, src_len, q.device)
                vectors, clusters = [rq, rk[:, :, new_keys]], [cq, ck[:, :, new_keys]]
            masks.append((same & allowed).expand(bsz, self.routing_heads, tgt_len, src_len))
            if self.training:  # only after routing: this batch never sees centroids fitted to it
                if bool(self.centroids_initialized):
                    self._update_centroids(vectors, clusters, query_padding)
                else:
                    self._init_centroids(vectors, query_padding)
        return torch.cat(masks, dim=1)

    @staticmethod
    def _query_padding(allowed, bsz, tgt_len, src_len):
        """(B, T) True at padding queries, or None: a query is padding exactly when its own key is masked
        (causal masks always allow it)."""
        if allowed is None or allowed.size(0) != bsz:
            return None
        rows = torch.arange(tgt_len, device=allowed.device)
        padding = ~allowed[:, 0, rows, rows + (src_len - tgt_len)]
        return padding if padding.any() else None

    def _batch_tokens(self, allowed, bsz, tgt_len, src_len):
        """(B, S) True at the keys that are this batch's real tokens (the last T, not padding), or None
        when every key is one."""
        padding = self._query_padding(allowed, bsz, tgt_len, src_len)
        if padding is None and src_len == tgt_len:
            return None
        real = torch.ones(bsz, tgt_len, dtype=torch.bool, device=self.centroids.device) if padding is None else ~padding
        return torch.cat([real.new_zeros(bsz, src_len - tgt_len), real], dim=1)

    # ------------------------------------------------------------------------------- centroids
    @staticmethod
    def _valid_vectors(vectors: List[torch.Tensor], clusters: Optional[List[torch.Tensor]], padding):
        """Stack (B, H, T, d) routing vectors of the batch's tokens: (H, N, d) vectors, (H, N) clusters."""
        heads = vectors[0].size(1)
        vec = torch.cat(vectors, dim=2)  # (B, H, nT, d)
        idx = None if clusters is None else torch.cat(clusters, dim=2)
        if padding is not None:
            keep = ~torch.cat([padding] * len(vectors), dim=1)  # (B, nT)
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
    def _update_centroids(self, vectors, clusters, padding):
        vec, idx = self._valid_vectors(vectors, clusters, padding)
        sums, counts = self._cluster_sums(vec, idx, self.num_clusters)
        means = sums / counts.clamp(min=1).unsqueeze(-1)
        updated = F.normalize(self.ema_decay * self.centroids + (1 - self.ema_decay) * means, dim=-1)
        self.centroids.copy_(torch.where((counts > 0).unsqueeze(-1), updated, self.centroids))

    @torch.no_grad()
    def _init_centroids(self, vectors, padding):
        vec, _ = self._valid_vectors(vectors, None, padding)
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
