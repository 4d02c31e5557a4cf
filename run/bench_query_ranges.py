#!/usr/bin/env python
"""How the BET(SF) CPU kernel's query ranges (``query_chunks``: rows per range x at most so many ranges)
change its cost against vanilla's causal SDPA, per sequence length: the attention core alone, forward
(no gradients) and forward + backward, all configurations interleaved round by round so that a noisy
machine disturbs them alike; medians in milliseconds and as a ratio to vanilla.

    python run/bench_query_ranges.py --lengths 128,512,1024 --configs 128x8,64x8,64x16,32x32 --rounds 20
"""

import argparse
import functools
import statistics

import torch
import torch.nn.functional as F

from bet_fairseq.core import kernels
from bet_fairseq.core.paths import bet_sf_fused
from bet_fairseq.core.masks import causal_allowed
from bet_fairseq.tools import timing


def measure(length, tokens, heads, head_dim, configs, rounds):
    batch = max(1, tokens // length)
    q, k, v = (torch.randn(batch, heads, length, head_dim) * 0.3 for _ in range(3))
    w = torch.randn(heads, 2 * head_dim) * 0.1
    allowed = causal_allowed(length, length, q.device)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, w)]
    default = kernels.query_chunks
    runs = {"vanilla": (lambda q, k, v, w: F.scaled_dot_product_attention(q, k, v, is_causal=True), None)}
    for name in configs:
        rows, most = map(int, name.split("x"))
        runs[name] = (lambda q, k, v, w: bet_sf_fused(q, k, v, w, allowed),
                      functools.partial(default, chunk=rows, most=most))
    clock = timing.Clock("wall")

    def forward_and_both(name):
        fn, chunks = runs[name]
        kernels.query_chunks = chunks or default
        kernels.KERNEL_MASKS.forget()  # the ranges are derived once per mask and remembered ...
        with torch.no_grad():
            fn(q, k, v, w)  # ... here, untimed: a model derives them once for all its layers
            fwd = clock.seconds(fn, q, k, v, w)
        return fwd, clock.seconds(lambda: fn(*leaves).sum().backward())

    try:
        times = timing.repeat(list(runs), rounds, forward_and_both, warmup=1)
    finally:
        kernels.query_chunks = default
        kernels.KERNEL_MASKS.forget()
    return {name: tuple(statistics.median(t) * 1e3 for t in zip(*pairs)) for name, pairs in times.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="128,512,1024", help="sequence lengths T")
    p.add_argument("--configs", default="128x8,64x8,64x16,32x32", help="ROWSxMOST: rows per range, most ranges")
    p.add_argument("--tokens", type=int, default=2048, help="tokens a batch (batch = tokens // T)")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--rounds", type=int, default=20)
    timing.add_threads_option(p)
    args = p.parse_args(argv)
    timing.set_threads(args.threads)
    torch.manual_seed(0)
    configs = [c for c in args.configs.split(",") if c]
    print(f"threads={torch.get_num_threads()} tokens={args.tokens} heads={args.heads} head_dim={args.head_dim} "
          f"rounds={args.rounds}; medians in ms (ratio to vanilla)")
    print("| T | config | forward | forward + backward |\n|---|---|---|---|")
    for length in map(int, args.lengths.split(",")):
        res = measure(length, args.tokens, args.heads, args.head_dim, configs, args.rounds)
        base = res["vanilla"]
        for name, (fwd, both) in res.items():
            print(f"| {length} | {name} | {fwd:.1f} ({fwd / base[0]:.2f}x) | {both:.1f} ({both / base[1]:.2f}x) |",
                  flush=True)


if __name__ == "__main__":
    main()
