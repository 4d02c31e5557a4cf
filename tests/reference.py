"""Naive, loop-by-loop float64 readings of the attention math, independent of the package.

Written from docs/method.md (Vaswani et al. attention, the diagonal ablations, BET(SF)) and the baseline
papers (Yang et al. 2018 localness, Zhao et al. 2019 top-k, Ramsauer et al. 2020 Hopfield, Roy et al.
2021 routing, Dai et al. 2019 Transformer-XL). Everything here reads *weights* and *option values* from a
module (``q_proj.weight``, ``options.diag_scale`` ...) and never calls package code: no module method, no
``bet_fairseq`` import. One query and one key at a time, in float64.

Conventions: ``x`` is time-first (T, B, E) like fairseq's; ``memory`` (M, B, E) are earlier positions
(Transformer-XL's memory) that come before ``x`` as keys only; query i stands at position M + i and sees
the keys j <= M + i that are not padding. A query that sees no key gets all-zero weights (and output
``out_proj``'s bias), which is what the package promises for left padding.
"""

import math
from types import SimpleNamespace
from typing import List

import torch

NEG = float("-inf")
DEFAULT_SPARSE_TOPK = 8  # Zhao et al.'s k when --sparse-topk is not given (the package's documented default)
LAYER_NORM_EPS = 1e-5


# ------------------------------------------------------------------------------------ small pieces
def projections(m) -> SimpleNamespace:
    """float64 (weight, bias) of the q, k, v and output projections of a fairseq-style module (``q_proj``
    ...) or of ``BirdEyeSelfAttention`` (one ``qkv`` linear, rows q | k | v)."""
    def lin(weight, bias):
        w = weight.detach().double()
        return w, (torch.zeros(w.size(0), dtype=torch.double) if bias is None else bias.detach().double())

    if hasattr(m, "qkv"):
        e = m.out_proj.weight.size(0)
        w, b = lin(m.qkv.weight, m.qkv.bias)
        q, k, v = ((w[i * e:(i + 1) * e], b[i * e:(i + 1) * e]) for i in range(3))
    else:
        q, k, v = (lin(p.weight, p.bias) for p in (m.q_proj, m.k_proj, m.v_proj))
    return SimpleNamespace(q=q, k=k, v=v, out=lin(m.out_proj.weight, m.out_proj.bias))


def linear(x, wb):
    w, b = wb
    return x @ w.T + b


def softmax_row(values: List[float]) -> List[float]:
    """softmax over a Python list that may hold -inf; a row of -inf only gives zeros."""
    finite = [v for v in values if v != NEG]
    if not finite:
        return [0.0] * len(values)
    top = max(finite)
    exps = [0.0 if v == NEG else math.exp(v - top) for v in values]
    total = sum(exps)
    return [e / total for e in exps]


def sigmoid(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


def dot(a, b) -> float:
    return sum(float(p) * float(q) for p, q in zip(a, b))


def route(vec, centroids):
    """Routing Transformer: layer-norm (no affine), unit-normalise, nearest centroid by cosine.
    Returns (cluster index, the unit vector as a list)."""
    vec = [float(a) for a in vec]
    mu = sum(vec) / len(vec)
    var = sum((a - mu) ** 2 for a in vec) / len(vec)
    z = [(a - mu) / math.sqrt(var + LAYER_NORM_EPS) for a in vec]
    norm = math.sqrt(sum(a * a for a in z))
    z = [a / norm for a in z]
    sims = [dot(z, c) for c in centroids]
    return max(range(len(sims)), key=lambda c: sims[c]), z


def sinusoid(distance: int, dim: int) -> List[float]:
    """Transformer-XL's R_d: [sin(d f_0) .. sin(d f_{E/2-1}) ; cos(...)], f_k = 10000^(-2k/E)."""
    freqs = [10000 ** (-2 * f / dim) for f in range(dim // 2)]
    return [math.sin(distance * f) for f in freqs] + [math.cos(distance * f) for f in freqs]


# ------------------------------------------------------------------------------------ the reference
@torch.no_grad()
def reference_attention(m, x, mode: str = "vanilla", key_padding_mask=None, memory=None, logit_scale: float = 1.0,
                        options=None, qkv=None):
    """The attention of variant ``mode`` with the weights (and options) of module ``m``.

    ``options``: an object with the variant's option fields (default ``m.options``). ``logit_scale``:
    multiplies the vanilla logits (a toy temperature). ``qkv``: the (T, B, H d) queries, keys and values
    (unscaled) when the caller computes them (a projection with q/k norms); then ``m`` needs only
    ``out_proj``. Returns a namespace: ``out`` (T, B, E), ``probs`` (B, H, T, S) the final weights, ``first``
    (B, H, T, S) BET(SF)'s first pass, ``r`` (B, H, S) BET's R.
    """
    options = getattr(m, "options", None) if options is None else options
    x = x.double()
    ctx = x if memory is None else torch.cat([memory.double(), x], dim=0)
    if qkv is None:
        proj = projections(m)
        q_all = linear(x, proj.q)  # (T, B, E), unscaled
        k_all = linear(ctx, proj.k)
        # Hopfield's pattern projection Y W_K W_V; everything else X W_V.
        v_all = linear(k_all, proj.v) if mode == "hopfield" else linear(ctx, proj.v)
    else:
        out_weight = m.out_proj.weight.detach().double()
        out_bias = m.out_proj.bias
        proj = SimpleNamespace(out=(out_weight, torch.zeros(out_weight.size(0), dtype=torch.double)
                                    if out_bias is None else out_bias.detach().double()))
        q_all, k_all, v_all = (t.double() for t in qkv)
    T, B, E = q_all.shape
    S = ctx.size(0)
    M = S - T
    H = m.num_heads
    d = E // H
    if mode == "bet_sf" and M:
        raise ValueError("the BET(SF) reference takes no memory (R of a memory key needs its first pass)")
    heads = torch.zeros(T, B, E, dtype=torch.double)
    probs = torch.zeros(B, H, T, S, dtype=torch.double)
    first = torch.zeros(B, H, T, S, dtype=torch.double)
    r_all = torch.zeros(B, H, S, dtype=torch.double)
    if mode == "relative":
        r_proj = m.r_proj.weight.detach().double()
        rel = [r_proj @ torch.tensor(sinusoid(dist, E), dtype=torch.double) for dist in range(S)]
    if mode == "localness":  # one window (P, D) per query, shared by the heads
        windows = [[localness_window(m, q_all[i, b], M + i) for i in range(T)] for b in range(B)]
    if mode == "routing":
        routing_heads = H // 2 if options.routing_heads is None else options.routing_heads
        local_heads = H - routing_heads
        cents = m.centroids.detach().double().tolist()
        # Roy et al.'s decoders share queries and keys: a routing head's keys are the (unscaled) queries
        shared_qk = not getattr(options, "routing_separate_qk", False)
        qk_all = linear(ctx, proj.q)

    for b in range(B):
        for h in range(H):
            cols = slice(h * d, (h + 1) * d)
            Q, K, V = q_all[:, b, cols], k_all[:, b, cols], v_all[:, b, cols]
            if mode == "routing" and h >= local_heads and shared_qk:
                K = qk_all[:, b, cols]

            def seen_by(i):
                """The keys query i may use: causal, not padding, and the variant's own restriction."""
                own = M + i
                seen = [j for j in range(own + 1)
                        if not (key_padding_mask is not None and bool(key_padding_mask[b, j]))]
                if mode == "routing" and h >= local_heads:
                    cq = route(Q[i], cents[h - local_heads])[0]
                    seen = [j for j in seen if j == own or route(K[j], cents[h - local_heads])[0] == cq]
                elif mode == "routing":
                    seen = [j for j in seen if own - j < options.routing_window]
                if mode == "diag_free" or (mode == "bet_sf" and not options.bet_keep_diagonal):
                    if any(j != own for j in seen):  # DiagFreeMask: a row with nothing else keeps itself
                        seen = [j for j in seen if j != own]
                return seen

            def dp(i, j):  # the scaled dot product D_ij
                return dot(Q[i], K[j]) / math.sqrt(d)

            if mode == "bet_sf":
                # first pass A = softmax(D) (causal, padding), H = A V; R_j = sigmoid(w . [H_j ; K_j])
                w = (m.bet_w if hasattr(m, "bet_w") else m.w).detach().double()  # fairseq / core module
                w = w[0 if w.size(0) == 1 else h]
                for i in range(T):
                    causal = [j for j in range(i + 1)
                              if not (key_padding_mask is not None and bool(key_padding_mask[b, j]))]
                    p = softmax_row([dp(i, j) if j in causal else NEG for j in range(S)])
                    first[b, h, i] = torch.tensor(p, dtype=torch.double)
                    h_i = [sum(p[j] * float(V[j, c]) for j in range(S)) for c in range(d)]
                    r_all[b, h, i] = sigmoid(dot(w[:d], h_i) + dot(w[d:], K[i]))

            for i in range(T):
                own, seen = M + i, seen_by(i)
                if mode == "hopfield":  # xi <- softmax(beta xi K^T) K, steps - 1 times, then beta xi K^T
                    beta = 1 / math.sqrt(d) if options.hopfield_beta is None else float(options.hopfield_beta)
                    xi = [float(a) for a in Q[i]]
                    for _ in range((options.hopfield_steps or 1) - 1):
                        p = softmax_row([beta * dot(xi, K[j]) if j in seen else NEG for j in range(S)])
                        xi = [sum(p[j] * float(K[j, c]) for j in range(S)) for c in range(d)]
                row = []
                for j in range(S):
                    if j not in seen:
                        a = NEG
                    elif mode in ("vanilla", "diag_free", "routing", "sparse_topk"):
                        a = dp(i, j) * logit_scale
                    elif mode == "diag_scale":
                        a = dp(i, j) * (float(options.diag_scale) if j == own else 1.0)
                    elif mode == "bet_sf":
                        a = dp(i, j) * float(r_all[b, h, j])
                    elif mode == "localness":
                        centre, width = windows[b][i]  # G_ij = -(j - P_i)^2 / (2 sigma_i^2), sigma = D / 2
                        sigma = max(width / 2, 1e-4)  # the package's guard: I_0 = 0 leaves query 0 no width
                        a = dp(i, j) - (j - centre) ** 2 / (2 * sigma ** 2)
                    elif mode == "relative":  # ((q + u) k + (q + v) W_R R_{i-j}) / sqrt(d)
                        u, vb, rd = m.u_bias.detach().double()[h], m.v_bias.detach().double()[h], rel[own - j][cols]
                        a = (dot(Q[i], K[j]) + dot(Q[i], rd) + dot(u, K[j]) + dot(vb, rd)) / math.sqrt(d)
                    elif mode == "hopfield":
                        a = beta * dot(xi, K[j])
                    else:
                        raise ValueError(f"no reference for mode {mode!r}")
                    row.append(a)
                if mode == "sparse_topk":  # keep the logits >= the k-th largest seen one (ties kept)
                    k = DEFAULT_SPARSE_TOPK if options.sparse_topk is None else options.sparse_topk
                    ranked = sorted((row[j] for j in seen), reverse=True)
                    threshold = ranked[k - 1] if len(ranked) >= k else NEG
                    row = [a if a >= threshold else NEG for a in row]
                p = softmax_row(row)
                probs[b, h, i] = torch.tensor(p, dtype=torch.double)
                heads[i, b, cols] = sum((p[j] * V[j] for j in range(S)), torch.zeros(d, dtype=torch.double))
    return SimpleNamespace(out=linear(heads, proj.out), probs=probs, first=first, r=r_all)


def localness_window(m, q_full, position: int):
    """Yang et al. 2018, causal: (P, D) for the full unscaled query of the query at ``position``, with
    P = I sigmoid(U_p tanh(W_p q)), D = I sigmoid(U_d tanh(W_p q)) and I = position (keeps P inside the keys
    0..position; ``localness_centre_scale`` "i", the default) or position + 1 ("i+1", version 0.1)."""
    w_p = m.localness_w_p.weight.detach().double()
    u_p, u_d = m.localness_u.weight.detach().double()
    hidden = [math.tanh(dot(row, q_full)) for row in w_p]
    visible = position + (1 if str(getattr(m.options, "localness_centre_scale", "i+1")) == "i+1" else 0)
    return visible * sigmoid(dot(u_p, hidden)), visible * sigmoid(dot(u_d, hidden))


def reference_for(m, x, key_padding_mask=None, memory=None):
    """``reference_attention`` in the mode of a registered variant module (the Hopfield library configuration:
    ``reference_hopfield_library``)."""
    if m.variant_name == "hopfield" and getattr(m.options, "hopfield_config", None) in (None, "library") \
            and memory is None:
        return reference_hopfield_library(m, x, m.num_heads, key_padding_mask=key_padding_mask)
    return reference_attention(m, x, m.variant_name, key_padding_mask=key_padding_mask, memory=memory)


@torch.no_grad()
def reference_first_pass_value_scores(q, k, v, w_h, allowed):
    """softmax(masked Q K^T) V w_h, per batch, head and query, written out: (B, H, T, 1)."""
    B, H, T, _ = q.shape
    out = torch.zeros(B, H, T, 1, dtype=torch.double)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                row = [dot(q[b, h, i], k[b, h, j]) if bool(allowed[0, 0, i, j]) else NEG for j in range(k.size(2))]
                p = softmax_row(row)
                hi = [sum(p[j] * float(v[b, h, j, c]) for j in range(k.size(2))) for c in range(v.size(3))]
                out[b, h, i, 0] = dot(hi, w_h[h, :, 0])
    return out


@torch.no_grad()
def reference_bet_authors(m, x, key_padding_mask=None):
    """The first author's BET(SF) (``--bet-form authors`` / ``authors_lm``) with the weights and options of ``m``,
    from the description of that code (docs/method.md, §3.4): a first pass ``A = softmax(D)`` (causal, padding),
    ``H = out_proj(A V)`` split back into heads; per head and key ``R_j = sigmoid(w . [K_j ; H_j] + b)`` (authors)
    or ``sigmoid(w . [Q_j / sqrt(d) ; H_j] + b)`` (authors_lm), one ``w`` (``bet_authors_w``) for all heads; R_j
    times the scaled ``Q K^T`` of column j, then the causal mask again (and, unlike that code, the padding mask)
    and the DiagFreeMask (unless ``bet_keep_diagonal``); ``A' V`` through ``bet_out_proj2``. Returns ``out``
    (T, B, E), ``probs`` A' and ``first`` A (B, H, T, T), ``r`` (B, H, T)."""
    form, keep = str(m.options.bet_form), bool(m.options.bet_keep_diagonal)
    proj = projections(m)
    out2 = (m.bet_out_proj2.weight.detach().double(), m.bet_out_proj2.bias.detach().double())
    w = [float(a) for a in m.bet_authors_w.weight.detach().double()[0]]
    w_bias = float(m.bet_authors_w.bias.detach().double()[0])
    x = x.double()
    T, B, E = x.shape
    H = m.num_heads
    d = E // H
    q_all, k_all, v_all = linear(x, proj.q), linear(x, proj.k), linear(x, proj.v)

    def visible(b, i):  # causal and not padding
        return [j for j in range(i + 1) if not (key_padding_mask is not None and bool(key_padding_mask[b, j]))]

    def dp(b, h, i, j):
        cols = slice(h * d, (h + 1) * d)
        return dot(q_all[i, b, cols], k_all[j, b, cols]) / math.sqrt(d)

    first = torch.zeros(B, H, T, T, dtype=torch.double)
    probs = torch.zeros(B, H, T, T, dtype=torch.double)
    r = torch.zeros(B, H, T, dtype=torch.double)
    heads1 = torch.zeros(T, B, E, dtype=torch.double)
    heads2 = torch.zeros(T, B, E, dtype=torch.double)
    for b in range(B):  # first pass, every head, then the output projection over the merged heads
        for h in range(H):
            for i in range(T):
                p = softmax_row([dp(b, h, i, j) if j in visible(b, i) else NEG for j in range(T)])
                first[b, h, i] = torch.tensor(p, dtype=torch.double)
                for c in range(d):
                    heads1[i, b, h * d + c] = sum(p[j] * float(v_all[j, b, h * d + c]) for j in range(T))
    h_proj = linear(heads1, proj.out)
    for b in range(B):
        for h in range(H):
            cols = slice(h * d, (h + 1) * d)
            for j in range(T):
                first_half = k_all[j, b, cols] if form == "authors" else q_all[j, b, cols] / math.sqrt(d)
                r[b, h, j] = sigmoid(dot(w[:d], first_half) + dot(w[d:], h_proj[j, b, cols]) + w_bias)
            for i in range(T):
                seen = visible(b, i)
                if not keep and any(j != i for j in seen):  # DiagFreeMask: row 0 keeps its diagonal
                    seen = [j for j in seen if j != i]
                p = softmax_row([dp(b, h, i, j) * float(r[b, h, j]) if j in seen else NEG for j in range(T)])
                probs[b, h, i] = torch.tensor(p, dtype=torch.double)
                for c in range(d):
                    heads2[i, b, h * d + c] = sum(p[j] * float(v_all[j, b, h * d + c]) for j in range(T))
    return SimpleNamespace(out=linear(heads2, out2), probs=probs, first=first, r=r)


@torch.no_grad()
def reference_topk_cross(m, query, context, key_padding_mask=None, k: int = DEFAULT_SPARSE_TOPK):
    """Zhao et al. 2019 in an attention without a causal mask (encoder self-attention: ``context`` is
    ``query``; encoder-decoder attention: ``context`` the encoder output (S, B, E)), with the weights of
    module ``m``: each query row keeps the logits >= the k-th largest non-padding one (ties kept; every
    key when fewer than k). Returns ``out`` (T, B, E) and ``probs`` (B, H, T, S)."""
    proj = projections(m)
    query, context = query.double(), context.double()
    T, B, E = query.shape
    S = context.size(0)
    H = m.num_heads
    d = E // H
    q_all, k_all, v_all = linear(query, proj.q), linear(context, proj.k), linear(context, proj.v)
    probs = torch.zeros(B, H, T, S, dtype=torch.double)
    heads = torch.zeros(T, B, E, dtype=torch.double)
    for b in range(B):
        seen = [j for j in range(S) if not (key_padding_mask is not None and bool(key_padding_mask[b, j]))]
        for h in range(H):
            cols = slice(h * d, (h + 1) * d)
            for i in range(T):
                row = [dot(q_all[i, b, cols], k_all[j, b, cols]) / math.sqrt(d) if j in seen else NEG
                       for j in range(S)]
                ranked = sorted((row[j] for j in seen), reverse=True)
                threshold = ranked[k - 1] if len(ranked) >= k else NEG
                p = softmax_row([a if a >= threshold else NEG for a in row])
                probs[b, h, i] = torch.tensor(p, dtype=torch.double)
                heads[i, b, cols] = sum((p[j] * v_all[j, b, cols] for j in range(S)), torch.zeros(d, dtype=torch.double))
    return SimpleNamespace(out=linear(heads, proj.out), probs=probs)


# ------------------------------------------------------------------------------------ routing: commitment
def _unit_layer_norm(vec: torch.Tensor) -> torch.Tensor:
    """Layer norm without affine, then unit length, written out (differentiable, float64)."""
    n = vec.numel()
    mu = vec.sum() / n
    var = ((vec - mu) ** 2).sum() / n
    z = (vec - mu) / torch.sqrt(var + LAYER_NORM_EPS)
    return z / torch.sqrt((z * z).sum())


def reference_commitment_loss(vectors, centroids, keep, weight):
    """The k-means commitment term summed over tokens: ``weight * sum_t mean_h ||r_th - mu_h(r_th)||^2`` with
    r the unit layer-normalised routing vector and mu its nearest centroid (held constant).

    ``vectors``: (B, H, L, d) float64 tensor (may require grad) of the routing heads' unscaled queries or
    keys; ``centroids`` (H, C, d); ``keep`` (B, L) booleans or None. Loops over tokens and heads."""
    B, H, L, _ = vectors.shape
    cents = centroids.detach().double()
    total = vectors.new_zeros(())
    for b in range(B):
        for t in range(L):
            if keep is not None and not bool(keep[b, t]):
                continue
            per_head = vectors.new_zeros(())
            for h in range(H):
                r = _unit_layer_norm(vectors[b, h, t])
                sims = [dot(r.detach(), c) for c in cents[h]]
                mu = cents[h][max(range(len(sims)), key=lambda c: sims[c])]
                per_head = per_head + ((r - mu) ** 2).sum()
            total = total + per_head / H
    return weight * total


def layer_norm_row(vec, weight, bias, eps: float = LAYER_NORM_EPS):
    """An affine LayerNorm of one vector, written out (float64 lists)."""
    vec = [float(a) for a in vec]
    mu = sum(vec) / len(vec)
    var = sum((a - mu) ** 2 for a in vec) / len(vec)
    return [(a - mu) / math.sqrt(var + eps) * float(w) + float(c) for a, w, c in zip(vec, weight, bias)]


@torch.no_grad()
def reference_hopfield_library(m, x, heads: int, key_padding_mask=None):
    """ml-jku/hopfield-layers' ``Hopfield`` layer (hflayers/__init__.py, activation.py, functional.py) with
    the weights of ``m`` and its options, causal, one query row at a time in float64:

    affine LayerNorms of the state pattern, stored pattern and pattern projection inputs (``norm_*``);
    xi = LN_R(x_i) W_Q + b_Q, K_j = LN_Y(x_j) W_K + b_K, V_j = LN_P(x_j) W_V + b_V, split into ``heads`` heads
    of E / heads; beta = 1/sqrt(E / heads) unless ``hopfield_beta``. p = softmax(beta xi K^T) over the seen keys;
    then, while fewer than ``update_steps_max`` updates were made (-1: no maximum; unset: ``hopfield_steps``
    - 1, else 0): xi = sum_j p_j K_j, p' = softmax(beta xi K^T), and the row stops once ||p' - p||_2 <=
    ``update_steps_eps`` (1e-4 unless given). Output out_proj(sum_j p_j V_j).

    Returns ``out`` (T, B, E), ``probs`` (B, heads, T, T) and ``updates`` (B, heads, T) made per row."""
    options = m.options
    proj = projections(m)
    x = x.double()
    T, B, E = x.shape
    d = E // heads
    beta = 1 / math.sqrt(d) if options.hopfield_beta is None else float(options.hopfield_beta)
    most = options.hopfield_update_steps_max
    if most is None:
        most = 0 if options.hopfield_steps is None else options.hopfield_steps - 1
    eps = 1e-4 if options.hopfield_update_steps_eps is None else float(options.hopfield_update_steps_eps)

    def normed(norm):
        w, c = norm.weight.detach().double(), norm.bias.detach().double()
        return torch.tensor([[layer_norm_row(x[t, b], w, c) for b in range(B)] for t in range(T)], dtype=torch.double)

    q_all = linear(normed(m.norm_state_pattern), proj.q)
    k_all = linear(normed(m.norm_stored_pattern), proj.k)
    v_all = linear(normed(m.norm_pattern_projection), proj.v)
    heads_out = torch.zeros(T, B, E, dtype=torch.double)
    probs = torch.zeros(B, heads, T, T, dtype=torch.double)
    updates = torch.zeros(B, heads, T, dtype=torch.long)
    for b in range(B):
        for h in range(heads):
            cols = slice(h * d, (h + 1) * d)
            Q, K, V = q_all[:, b, cols], k_all[:, b, cols], v_all[:, b, cols]
            for i in range(T):
                seen = [j for j in range(i + 1) if not (key_padding_mask is not None and bool(key_padding_mask[b, j]))]

                def associate(xi):
                    return softmax_row([beta * dot(xi, K[j]) if j in seen else NEG for j in range(T)])

                p = associate(Q[i])
                n = 0
                while most < 0 or n < most:
                    xi = [sum(p[j] * float(K[j, c]) for j in range(T)) for c in range(d)]
                    new = associate(xi)
                    change = math.sqrt(sum((a - c) ** 2 for a, c in zip(new, p)))
                    p, n = new, n + 1
                    if change <= eps:
                        break
                probs[b, h, i] = torch.tensor(p, dtype=torch.double)
                updates[b, h, i] = n
                heads_out[i, b, cols] = sum((p[j] * V[j] for j in range(T)), torch.zeros(d, dtype=torch.double))
    return SimpleNamespace(out=linear(heads_out, proj.out), probs=probs, updates=updates)
