#!/usr/bin/env python
"""Micro-benchmark of one decoder self-attention module: fairseq's vanilla MultiheadAttention vs
the bet_fairseq variants (bet_sf on its fused (SDPA) and exact paths, diag_free, any other by --modes).

    python run/bench_attention.py --embed 512 --heads 4 --tgt 25 --batch 160 --reps 20

Measures (median ms of process CPU time, robust to other load on the machine): a training forward+backward over a full (T, B, E) block with the causal
mask, and one incremental-decoding pass of T steps over a batch of B x beam hypotheses. Used to
find where BET(SF) spends its extra time; bench_speed.py measures the whole model.
"""

import argparse
import statistics
import time

import torch

from fairseq.modules.multihead_attention import MultiheadAttention


def future_mask(n):
    return torch.triu(torch.full((n, n), float("-inf")), 1)


def main(argv=None):
    import bet_fairseq

    bet_fairseq.register()
    from bet_fairseq.attention import VARIANTS

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--embed", type=int, default=512)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--tgt", type=int, default=25)
    p.add_argument("--batch", type=int, default=160)
    p.add_argument("--beam-batch", type=int, default=80, help="hypotheses in incremental decoding")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--modes", default="", help="comma-separated further --self-attn-mode names to time")
    args = p.parse_args(argv)
    E, H, T, B = args.embed, args.heads, args.tgt, args.batch
    torch.manual_seed(0)
    variant = lambda name: VARIANTS[name](E, H, dropout=args.dropout)  # noqa: E731
    modules = {
        "vanilla (fairseq)": MultiheadAttention(E, H, dropout=args.dropout, self_attention=True),
        "bet_sf default (exact on CPU up to 128 keys)": variant("bet_sf"),
        "bet_sf SDPA forced": variant("bet_sf"),
        "bet_sf exact": variant("bet_sf"),
        "diag_free fused": variant("diag_free"),
    }
    for name in filter(None, args.modes.split(",")):
        modules[name] = variant(name)
    modules["bet_sf exact"].use_fused_attention = False
    modules["bet_sf SDPA forced"].cpu_exact_max_keys = 0
    x = torch.randn(T, B, E, requires_grad=True)
    mask = future_mask(T)
    xb = torch.randn(T, args.beam_batch, E)

    print(f"E={E} H={H} T={T} B={B} beam-batch={args.beam_batch} threads={torch.get_num_threads()}")
    print("| module | train fwd+bwd ms | incremental T steps ms |")
    print("|---|---|---|")
    jobs = {}
    for name, m in modules.items():

        def train_step(m=m):
            m.train()
            out, _ = m(x, x, x, attn_mask=mask, need_weights=False)
            out.sum().backward()

        def decode(m=m):
            m.eval()
            state = {}
            with torch.no_grad():
                for t in range(T):
                    q = xb[t : t + 1]
                    m(q, q, q, incremental_state=state, need_weights=False)

        jobs[name] = (train_step, decode)
        train_step(), decode()  # warm-up
    times = {name: ([], []) for name in jobs}
    for _ in range(args.reps):  # interleaved, so that load changes hit every module alike
        for name, fns in jobs.items():
            for fn, bucket in zip(fns, times[name]):
                start = time.process_time()
                fn()
                bucket.append(time.process_time() - start)
    for name, (train_t, dec_t) in times.items():
        print(f"| {name} | {1000 * statistics.median(train_t):.2f} | {1000 * statistics.median(dec_t):.2f} |")

if __name__ == "__main__":
    main()
