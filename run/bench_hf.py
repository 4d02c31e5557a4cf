#!/usr/bin/env python
"""A BET(SF) GPT-2 training step against the stock one (Hugging Face transformers), same weights, same batches.

    python run/bench_hf.py                                  # GPT-2 small: 12 layers, 768 dims, 12 heads, 4 x 256
    python run/bench_hf.py --layers 2 --dim 64 --heads 4 --batch 2 --length 32 --reps 2    # seconds, a smoke run

A training step is forward, backward and an AdamW step (``model(ids, labels=ids)``, dropout on as the GPT-2
config has it, no cache: what a training loop runs). The two models alternate, their order swapped every
repetition, after ``--warmup`` untimed steps each; prints each repetition, the medians and the median of the
per-repetition ratios (BET / stock time; > 1: BET slower). Wall clock on whatever device ``--device`` names.
"""

import argparse
import statistics

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from bet_fairseq.hf import to_bet
from bet_fairseq.tools import timing


def training_step(model, optimiser, ids):
    loss = model(ids, labels=ids, use_cache=False).loss
    optimiser.zero_grad(set_to_none=True)
    loss.backward()
    optimiser.step()
    return loss


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(0)
    stock = GPT2LMHeadModel(GPT2Config(n_layer=args.layers, n_embd=args.dim, n_head=args.heads,
                                       vocab_size=args.vocab, n_positions=max(1024, args.length)))
    models = {"stock": stock.to(device).train(), "bet_sf": to_bet(stock).to(device).train()}
    optimisers = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in models.items()}
    ids = torch.randint(0, args.vocab, (args.batch, args.length), device=device)
    extra = sum(p.numel() for n, p in models["bet_sf"].named_parameters() if n.endswith("bet_w"))
    print(f"GPT-2 {args.layers} layers x {args.dim} dims x {args.heads} heads, batch {args.batch} x {args.length}, "
          f"{sum(p.numel() for p in stock.parameters()):,} parameters (BET adds {extra:,}), {device}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name, model in models.items():
        for _ in range(args.warmup):
            training_step(model, optimisers[name], ids)
    clock = timing.Clock("wall", device)
    times = timing.repeat(list(models), args.reps,
                          lambda name: clock.seconds(training_step, models[name], optimisers[name], ids),
                          report=lambda rep, t: print(f"rep {rep + 1}: stock {t['stock']:.3f} s, bet_sf "
                                                      f"{t['bet_sf']:.3f} s, ratio {t['bet_sf'] / t['stock']:.3f}"))
    tokens = args.batch * args.length
    for name in models:
        median = statistics.median(times[name])
        print(f"{name}: median {median:.3f} s a step, {tokens / median:.0f} tokens/s")
    print(f"BET / stock step time: median of per-repetition ratios "
          f"{timing.median_ratio(times['stock'], times['bet_sf']):.3f} "
          f"(ratio of medians {timing.ratio_of_medians(times['stock'], times['bet_sf']):.3f})")


if __name__ == "__main__":
    main()
