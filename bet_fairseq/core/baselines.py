"""The score functions of the baselines the paper compares BET with, in plain PyTorch (no fairseq import):
sparse top-k (Zhao et al. 2019), localness (Yang et al. 2018), Hopfield (Ramsauer et al. 2020), Transformer-XL's
relative positions (Dai et al. 2019) and the Routing Transformer's clustering (Roy et al. 2021). Each is what one
``bet_fairseq.attention`` variant computes beside plain attention (docs/baselines.md); the conventions are the
package's (``q, k, v`` as (batch, heads, length, head_dim), queries at the last T of the S key positions).
"""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .masks import masked_softmax


def top_k_keep(logits: Tensor, allowed: Optional[Tensor], k: int) -> Tensor:
    """Zhao et al. 2019: the logits each row keeps: allowed and >= the row's k-th largest allowed
    logit (ties all kept); every allowed entry when a row has fewer than k."""
    masked = logits if allowed is None else logits.masked_fill(~allowed, float("-inf"))
    kk = min(k, masked.size(-1))
    kth = masked.topk(kk, dim=-1).values[..., -1:]  # -inf when fewer than k are allowed
    keep = masked >= kth
    return keep if allowed is None else keep & allowed


def localness_bias(centre: Tensor, width: Tensor, src_len: int, min_sigma: float = 1e-4) -> Tensor:
    """Yang et al. 2018: Gaussian bias ``-(j - P_i)^2 / (2 sigma_i^2)``, sigma = D / 2, (B, 1, T, S),
    in float32 (in half precision the bias of a narrow window would overflow to -inf)."""
    centre, width = centre.float(), width.float()
    sigma = (width / 2).clamp_min(min_sigma)
    keys = torch.arange(src_len, device=centre.device, dtype=torch.float32)
    bias = -((keys.view(1, 1, -1) - centre.unsqueeze(-1)) ** 2) / (2 * sigma.unsqueeze(-1) ** 2)
    return bias.unsqueeze(1)


def hopfield_logits(xi: Tensor, k: Tensor, beta: float, steps: Optional[int], allowed: Optional[Tensor],
                    eps: Optional[float] = None) -> Tensor:
    """Ramsauer et al. 2020: ``steps - 1`` updates ``xi <- softmax(beta xi K^T) K`` of the (unscaled)
    state patterns, then the final logits ``beta xi K^T``.

    ``eps`` (the hopfield-layers library's ``update_steps_eps``): a query row stops updating once its
    association row changed by at most ``eps`` (L2) in an update, and keeps the logits of that update;
    ``steps`` is then a maximum (None: none). The decision is per (batch, head, query) row, so a row never
    depends on another row (causal, and a decoding step equals the full pass); the library decides per
    head over the whole batch.
    """
    kt = k.transpose(-1, -2)
    logits = beta * torch.matmul(xi, kt)
    if eps is None or steps == 1:
        for _ in range(steps - 1):
            xi = torch.matmul(masked_softmax(logits, allowed, xi.dtype), k)
            logits = beta * torch.matmul(xi, kt)
        return logits
    probs = masked_softmax(logits, allowed, torch.float32)
    active = torch.ones(logits.shape[:-1], dtype=torch.bool, device=logits.device)
    step = 1
    while (steps is None or step < steps) and bool(active.any()):
        new_logits = beta * torch.matmul(torch.matmul(probs.to(k.dtype), k), kt)
        new_probs = masked_softmax(new_logits, allowed, torch.float32)
        rows = active.unsqueeze(-1)
        logits = torch.where(rows, new_logits, logits)
        with torch.no_grad():
            active = active & ((new_probs - probs).norm(dim=-1) > eps)
        probs = torch.where(rows, new_probs, probs)
        step += 1
    return logits


def relative_sinusoids(length: int, dim: int, device=None, dtype=torch.float) -> Tensor:
    """Transformer-XL's R_d for the distances d = 0 .. length-1: (length, dim), [sin ; cos]."""
    if dim % 2:
        raise ValueError(f"the relative sinusoid needs an even model dimension, got {dim}")
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=device, dtype=torch.float) / dim))
    angles = torch.arange(length, device=device, dtype=torch.float).unsqueeze(1) * inv_freq
    return torch.cat([angles.sin(), angles.cos()], dim=-1).to(dtype)


def relative_logits(q: Tensor, k: Tensor, r: Tensor, u: Tensor, v: Tensor, clamp_len: Optional[int] = None) -> Tensor:
    """Transformer-XL (Dai et al. 2019, 3.3): ``(q_i + u)^T k_j + (q_i + v)^T r_{i-j}``.

    q (B, H, T, d), k (B, H, S, d) with the queries at the last T positions; r (H, R, d) the projected
    sinusoids of the distances 0 .. R-1 (R = S, or clamp_len + 1 when that is fewer); u, v (H, d). The
    distance term is computed once per distance and gathered into the (i, j) grid (the same numbers as the
    paper's relative shift). Distances < 0 (future keys) read distance 0; the causal mask removes them.
    ``clamp_len``: distances beyond it read ``r`` of ``clamp_len`` (the reference code's ``clamp_len``).
    """
    tgt_len, src_len = q.size(2), k.size(2)
    content = torch.matmul(q + u.unsqueeze(1), k.transpose(-1, -2))
    by_distance = torch.matmul(q + v.unsqueeze(1), r.transpose(-1, -2))  # (B, H, T, distance)
    qpos = torch.arange(src_len - tgt_len, src_len, device=q.device).unsqueeze(1)
    distance = (qpos - torch.arange(src_len, device=q.device).unsqueeze(0)).clamp(min=0, max=clamp_len)
    return content + by_distance.gather(-1, distance.expand(q.size(0), q.size(1), -1, -1))


def routing_vectors(x: Tensor) -> Tensor:
    """Routing Transformer: layer-normalise (no affine) and unit-normalise (at least float32)."""
    if x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()
    return F.normalize(F.layer_norm(x, x.shape[-1:]), dim=-1)


def nearest_centroid(x: Tensor, centroids: Tensor) -> Tensor:
    """x (B, H, L, d) unit vectors, centroids (H, C, d) -> cluster index (B, H, L)."""
    return torch.einsum("bhld,hcd->bhlc", x, centroids.to(x.dtype)).argmax(dim=-1)


def routing_commitment(r: Tensor, centroids: Tensor, keep: Optional[Tensor] = None) -> Tensor:
    """Roy et al.'s k-means commitment term of each token, ``mean_h ||r_h - mu(r_h)||^2``, (B, L).

    r (B, H, L, d) routing vectors, centroids (H, C, d), mu(r) the nearest centroid (a constant: the
    term pulls the vectors towards their centroids, never the centroids); ``keep`` (B, L) zeroes padding.
    With unit vectors this is the reference code's mean of ``(LN(x) - mu)^2`` over the dimensions, whose
    layer-normalised vectors have norm sqrt(d)."""
    idx = nearest_centroid(r.detach(), centroids)
    heads = torch.arange(r.size(1), device=r.device).view(1, -1, 1)
    mu = centroids.to(r.dtype)[heads, idx]  # (B, H, L, d)
    per_token = (r - mu).square().sum(-1).mean(1)
    return per_token if keep is None else per_token * keep.to(per_token.dtype)


class _CommitmentGradient(torch.autograd.Function):
    """Identity forward; backward adds the gradient of ``weight * sum of routing_commitment`` over the
    routing heads ``x[:, first_head:]`` (routing vectors of ``x / divisor``). fairseq's criterions sum
    the loss over tokens and the trainer divides the gradients by the sample size (tokens), so a
    per-token sum here becomes the reference code's per-token mean; the reported loss stays the
    criterion's own (perplexity is not changed)."""

    @staticmethod
    def forward(ctx, x, centroids, keep, weight, first_head, divisor):
        ctx.save_for_backward(x, centroids, keep)
        ctx.weight, ctx.first_head, ctx.divisor = weight, first_head, divisor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        x, centroids, keep = ctx.saved_tensors
        with torch.enable_grad():
            xr = x[:, ctx.first_head:].detach().requires_grad_()
            loss = ctx.weight * routing_commitment(routing_vectors(xr / ctx.divisor), centroids, keep).sum()
            (extra,) = torch.autograd.grad(loss, xr)
        grad = grad.clone()
        grad[:, ctx.first_head:] += extra.to(grad.dtype)
        return grad, None, None, None, None, None


def with_commitment_gradient(x: Tensor, centroids: Tensor, keep: Optional[Tensor], weight: float,
                             first_head: int = 0, divisor: float = 1.0) -> Tensor:
    """``x`` (B, H, L, d) unchanged, whose gradient gains that of ``weight * routing_commitment`` summed
    over the tokens, for the heads from ``first_head`` (see ``_CommitmentGradient``). ``centroids``:
    the ones the forward routed with (pass a copy if they change before the backward)."""
    return _CommitmentGradient.apply(x, centroids, keep, float(weight), int(first_head), float(divisor))
