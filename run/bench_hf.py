#!/usr/bin/env python
"""A BET(SF) model against the stock one in Hugging Face transformers, same weights, same batches: a training step,
or generation with the static cache against the dynamic one.

    python run/bench_hf.py                                  # GPT-2 small: 12 layers, 768 dims, 12 heads, 4 x 256
    python run/bench_hf.py --layers 2 --dim 64 --heads 4 --batch 2 --length 32 --reps 2    # seconds, a smoke run
    python run/bench_hf.py --family llama --kv-heads 2 --compile ...   # both models under torch.compile
    python run/bench_hf.py --task generate --new-tokens 32 ...         # BET: static cache vs dynamic cache

``--task train``: forward, backward and an AdamW step (``model(ids, labels=ids)``, dropout as the family's config has
it, no cache: what a training loop runs); prints the BET / stock time ratio (> 1: BET slower). ``--compile``:
``torch.compile(model, fullgraph=True)`` for both (the first, untimed, steps compile; their time is printed).

``--task generate``: the BET model's greedy ``generate`` of ``--new-tokens`` tokens after a ``--length`` prompt with
``cache_implementation="static"`` against the default dynamic cache; prints tokens per second and the static /
dynamic speed ratio (> 1: static faster). ``--compile``: the static cache's decoding step compiled (transformers'
``compile_config``; the dynamic cache is never compiled by ``generate``).

The runs alternate, their order swapped every repetition, after ``--warmup`` untimed runs each; the script prints
each repetition, the medians and the median of the per-repetition ratios. Wall clock on ``--device``.
"""

import argparse
import statistics

import torch
from transformers import CompileConfig

from bet_fairseq.hf import BET_CLASSES, to_bet
from bet_fairseq.tools import timing

FAMILIES = {cls.config_class.model_type[len("bet_"):]: stock for stock, cls in BET_CLASSES.items()}


def stock_config(family: str, layers: int, dim: int, heads: int, kv_heads: int, vocab: int, positions: int):
    """The family's config at these sizes (GPT-2's dropout kept; the others' full causal attention)."""
    config_class = FAMILIES[family].config_class
    if family == "gpt2":
        special = min(50256, vocab - 1)  # GPT-2's end-of-text token, inside a smaller vocabulary
        return config_class(n_layer=layers, n_embd=dim, n_head=heads, vocab_size=vocab, n_positions=positions,
                            bos_token_id=special, eos_token_id=special)
    extra = {"mistral": dict(sliding_window=None), "phi3": dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)}
    return config_class(num_hidden_layers=layers, hidden_size=dim, intermediate_size=4 * dim, num_attention_heads=heads,
                        num_key_value_heads=kv_heads, head_dim=dim // heads, vocab_size=vocab,
                        max_position_embeddings=positions, **extra.get(family, {}))


def training_step(model, optimiser, ids):
    loss = model(ids, labels=ids, use_cache=False).loss
    optimiser.zero_grad(set_to_none=True)
    loss.backward()
    optimiser.step()
    return loss


def alternate(runs: dict, reps: int, warmup: int, device, unit: str):
    """Time each of ``runs`` (name -> callable) ``reps`` times, alternating, order swapped every repetition, after
    ``warmup`` untimed calls each (the first of them printed: it holds any compilation). Returns name -> seconds."""
    clock = timing.Clock("wall", device)
    for name, run in runs.items():
        for i in range(warmup):
            seconds = clock.seconds(run)
            if i == 0:
                print(f"{name}: first {unit} {seconds:.2f} s (with any compilation)")
    names = list(runs)

    def show(rep, t):
        print(f"rep {rep + 1}: " + ", ".join(f"{name} {t[name]:.3f} s" for name in names)
              + f", {names[1]} / {names[0]} time {t[names[1]] / t[names[0]]:.3f}")

    return timing.repeat(names, reps, lambda name: clock.seconds(runs[name]), report=show)


def report(times: dict, work: int, what: str, inverse: bool = False):
    """Medians, work per second, and the ratio of the second run to the first (its inverse: a speed ratio)."""
    first, second = list(times)
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name}: median {median:.3f} s, {work / median:.1f} {what}/s")
    base, other = (times[second], times[first]) if inverse else (times[first], times[second])
    ratio = timing.median_ratio(base, other)
    label = f"{second} / {first} {'speed' if inverse else 'time'}"
    print(f"{label}: median of per-repetition ratios {ratio:.3f} (ratio of medians "
          f"{timing.ratio_of_medians(base, other):.3f})")
    return ratio


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=("train", "generate"), default="train")
    parser.add_argument("--family", choices=sorted(FAMILIES), default="gpt2")
    parser.add_argument("--compile", action="store_true", help="torch.compile (fullgraph) the timed models")
    parser.add_argument("--backend", default="inductor", help="torch.compile's backend with --compile")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=None, help="key-value heads (Llama-shaped; default --heads)")
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=256, help="training length, or the prompt's under generate")
    parser.add_argument("--new-tokens", type=int, default=64, help="generated tokens (--task generate)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if args.reps < 1 or args.warmup < (1 if args.compile else 0):
        parser.error("--reps must be >= 1, and --warmup >= 1 with --compile (the compiling run is not timed)")
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    torch.manual_seed(0)
    positions = max(1024, args.length + args.new_tokens)
    stock = FAMILIES[args.family](stock_config(args.family, args.layers, args.dim, args.heads,
                                               args.kv_heads or args.heads, args.vocab, positions))
    stock = stock.to(device=device, dtype=dtype)
    bet = to_bet(stock)
    extra = sum(p.numel() for n, p in bet.named_parameters() if n.endswith("bet_w"))
    print(f"{args.family} {args.layers} layers x {args.dim} dims x {args.heads} heads, {args.task}, batch "
          f"{args.batch} x {args.length}, {sum(p.numel() for p in stock.parameters()):,} parameters (BET adds "
          f"{extra:,}), {device}, {args.dtype}, compile {args.compile}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    ids = torch.randint(0, args.vocab, (args.batch, args.length), device=device)
    if args.task == "train":
        models = {"stock": stock.train(), "bet_sf": bet.train()}
        stock.loss_type = stock.loss_type or "ForCausalLM"  # GPT-2's is None: a warning a compiled graph cannot hold
        optimisers = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in models.items()}
        calls = {name: torch.compile(m, fullgraph=True, backend=args.backend) if args.compile else m
                 for name, m in models.items()}
        runs = {name: (lambda name=name: training_step(calls[name], optimisers[name], ids)) for name in models}
        times = alternate(runs, args.reps, args.warmup, device, "step")
        return report(times, args.batch * args.length, "tokens")
    bet.eval()
    options = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)
    static = dict(cache_implementation="static")
    if args.compile:
        static["compile_config"] = CompileConfig(fullgraph=True, backend=args.backend, mode="default")
        static["compile_config"]._compile_all_devices = True  # transformers compiles only on accelerators unless told
    else:
        static["disable_compile"] = True

    def generate(**kwargs):
        with torch.no_grad():
            return bet.generate(ids, **options, **kwargs)

    runs = {"dynamic": generate, "static": lambda: generate(**static)}
    times = alternate(runs, args.reps, args.warmup, device, "generate")
    return report(times, args.batch * args.new_tokens, "tokens", inverse=True)


if __name__ == "__main__":
    main()
