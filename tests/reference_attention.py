"""A deliberately naive, loop-by-loop reading of BET_SPEC sections 1-2, independent of the package.

It takes only the weights of a fairseq MultiheadAttention (q/k/v/out projections) and, for BET(SF),
the w vectors, and recomputes one sequence position by position.
"""

import math

import torch


@torch.no_grad()
def reference_self_attention(x, mha, mode="vanilla", diag_scale=1.0, keep_diagonal=False, w=None,
                             key_padding_mask=None):
    """x: (T, B, E). Returns (out (T, B, E), final probs (B, H, T, T), first-pass probs or None, R)."""
    T, B, E = x.shape
    H = mha.num_heads
    d = E // H
    Wq, bq = mha.q_proj.weight.double(), mha.q_proj.bias.double()
    Wk, bk = mha.k_proj.weight.double(), mha.k_proj.bias.double()
    Wv, bv = mha.v_proj.weight.double(), mha.v_proj.bias.double()
    Wo, bo = mha.out_proj.weight.double(), mha.out_proj.bias.double()
    x = x.double()
    heads_out = torch.zeros(T, B, E, dtype=torch.double)
    probs_all = torch.zeros(B, H, T, T, dtype=torch.double)
    first_all = torch.zeros(B, H, T, T, dtype=torch.double)
    r_all = torch.zeros(B, H, T, dtype=torch.double)
    neg = float("-inf")
    for b in range(B):
        for h in range(H):
            rows = slice(h * d, (h + 1) * d)
            Q = x[:, b] @ Wq[rows].T + bq[rows]
            K = x[:, b] @ Wk[rows].T + bk[rows]
            V = x[:, b] @ Wv[rows].T + bv[rows]
            D = torch.empty(T, T, dtype=torch.double)
            for i in range(T):
                for j in range(T):
                    pad = key_padding_mask is not None and bool(key_padding_mask[b, j])
                    D[i, j] = neg if (j > i or pad) else float(Q[i] @ K[j]) / math.sqrt(d)
            if mode == "diag_scale":
                for i in range(T):
                    D[i, i] = D[i, i] * diag_scale
            if mode == "bet_sf":
                A = torch.softmax(D, dim=-1)
                first_all[b, h] = A
                Hh = A @ V
                wh = w[0 if w.shape[0] == 1 else h].double()
                R = torch.tensor([torch.sigmoid(wh @ torch.cat([Hh[j], K[j]])).item() for j in range(T)],
                                 dtype=torch.double)
                r_all[b, h] = R
                for i in range(T):
                    for j in range(T):
                        D[i, j] = D[i, j] * R[j]
            if mode == "diag_free" or (mode == "bet_sf" and not keep_diagonal):
                for i in range(1, T):  # row 0 can only see itself
                    D[i, i] = neg
            A2 = torch.softmax(D, dim=-1)
            probs_all[b, h] = A2
            heads_out[:, b, rows] = A2 @ V
    out = heads_out @ Wo.T + bo
    return out, probs_all, (first_all if mode == "bet_sf" else None), r_all
