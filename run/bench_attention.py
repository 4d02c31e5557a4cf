#!/usr/bin/env python
"""Micro-benchmark of one decoder self-attention module: fairseq's vanilla MultiheadAttention vs
the bet_fairseq variants (bet_sf on its fused (SDPA) and exact paths, diag_free, any other by --modes).

    python run/bench_attention.py --embed 512 --heads 4 --tgt 25 --batch 160 --reps 20
    python run/bench_attention.py --sweep 128,512,2048,8192 --dtypes float16,bfloat16 --device cuda --out DIR

``--sweep T1,T2,...``: the attention core alone (q, k, v of ``--heads`` heads, ``--sweep-tokens`` tokens a batch)
per sequence length and dtype: vanilla (one causal SDPA call) vs ``bet_sf_fused`` (the path training takes),
forward and forward+backward milliseconds and, on CUDA, the peak memory of forward+backward beyond the inputs
(``torch.cuda.max_memory_allocated``; on CPU not measured) and that memory per token, which stays flat when
memory is linear in T. Writes ``DIR/attention_sweep.json`` and ``.md``.

Measures (median ms of process CPU time, robust to other load on the machine): a training forward+backward over a full (T, B, E) block with the causal
mask, and one incremental-decoding pass of T steps over a batch of B x beam hypotheses. Used to
find where BET(SF) spends its extra time; bench_speed.py measures the whole model.
"""

import argparse
import json
import os
import statistics

import torch

from fairseq.modules.multihead_attention import MultiheadAttention

from bet_fairseq.tools import timing


def future_mask(n):
    return torch.triu(torch.full((n, n), float("-inf")), 1)


def sweep(args):
    """Vanilla SDPA vs BET(SF)'s fused path per T and dtype: times and (CUDA) peak memory."""
    import torch.nn.functional as F

    from bet_fairseq.core.paths import bet_sf_fused
    from bet_fairseq.core.masks import causal_allowed

    device, heads, head_dim = torch.device(args.device), args.heads, args.embed // args.heads
    cuda = device.type == "cuda"
    clock = timing.Clock("wall" if cuda else "cpu", device)

    def vanilla(q, k, v, w, allowed):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)

    def bet(q, k, v, w, allowed):
        return bet_sf_fused(q, k, v, w, allowed)

    rows = []
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        for tgt in (int(t) for t in args.sweep.split(",")):
            batch = max(1, args.sweep_tokens // tgt)
            torch.manual_seed(0)
            q, k, v = (torch.randn(batch, heads, tgt, head_dim, device=device, dtype=dtype, requires_grad=True)
                       for _ in range(3))
            w = (0.1 * torch.randn(heads, 2 * head_dim, device=device, dtype=dtype)).requires_grad_()
            allowed = causal_allowed(tgt, tgt, device)
            for name, fn in (("vanilla", vanilla), ("bet_sf", bet)):
                fwd, total = [], []
                for rep in range(args.reps + 1):  # the first is a warm-up
                    if cuda:
                        torch.cuda.synchronize()
                        torch.cuda.reset_peak_memory_stats()
                        before = torch.cuda.memory_allocated()
                    start = clock.read()
                    out = fn(q, k, v, w, allowed)
                    mid = clock.read()
                    out.float().square().sum().backward()
                    end = clock.read()
                    peak = (torch.cuda.max_memory_allocated() - before) / 2**20 if cuda else None
                    del out
                    q.grad = k.grad = v.grad = w.grad = None
                    if rep:
                        fwd.append(mid - start)
                        total.append(end - start)
                rows.append(dict(dtype=dtype_name, T=tgt, batch=batch, module=name,
                                 forward_ms=1000 * statistics.median(fwd), fwd_bwd_ms=1000 * statistics.median(total),
                                 peak_mb=peak, peak_kb_per_token=None if peak is None else 1024 * peak / (batch * tgt)))
                print(json.dumps(rows[-1]), flush=True)
    lines = [f"device={args.device} heads={heads} head_dim={head_dim} tokens a batch={args.sweep_tokens} "
             f"reps={args.reps} torch {torch.__version__}", "",
             "| dtype | T | batch | module | forward ms | fwd+bwd ms | peak MiB | peak KiB per token |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mem = ("n/a", "n/a") if r["peak_mb"] is None else (f"{r['peak_mb']:.1f}", f"{r['peak_kb_per_token']:.2f}")
        lines.append(f"| {r['dtype']} | {r['T']} | {r['batch']} | {r['module']} | {r['forward_ms']:.2f} | "
                     f"{r['fwd_bwd_ms']:.2f} | {mem[0]} | {mem[1]} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "attention_sweep.json"), "w", encoding="utf-8") as f:
            json.dump(dict(device=args.device, heads=heads, head_dim=head_dim, rows=rows), f, indent=2)
        with open(os.path.join(args.out, "attention_sweep.md"), "w", encoding="utf-8") as f:
            f.write(text + "\n")


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
    p.add_argument("--sweep", help="comma-separated sequence lengths: the attention-core sweep instead")
    p.add_argument("--sweep-tokens", type=int, default=16384, help="--sweep: tokens a batch (batch = this / T)")
    p.add_argument("--dtypes", default="float32", help="--sweep: comma-separated torch dtypes")
    p.add_argument("--device", default="cpu", help="--sweep: cpu or cuda")
    p.add_argument("--out", help="--sweep: write attention_sweep.json and .md into this folder")
    args = p.parse_args(argv)
    if args.sweep:
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            p.error("--device cuda: no CUDA device is available")
        return sweep(args)
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
    clock = timing.Clock("cpu")
    # interleaved, so that load changes hit every module alike
    times = timing.repeat(list(jobs), args.reps, lambda name: tuple(clock.seconds(fn) for fn in jobs[name]))
    for name, values in times.items():
        train_t, dec_t = zip(*values)
        print(f"| {name} | {1000 * statistics.median(train_t):.2f} | {1000 * statistics.median(dec_t):.2f} |")

if __name__ == "__main__":
    main()
