#!/usr/bin/env python
"""The checks run/check_gpu.sh runs on a CUDA GPU: bet_fairseq.hf's fused and compiled paths in float16 and bfloat16,
then the speed ratios (run/bench_hf.py). Every check prints one line; any failure ends with a non-zero exit.

    python run/check_gpu.py                       # CUDA: every family, float16 and bfloat16, Inductor
    python run/check_gpu.py --device cpu --families gpt2 --dtypes bfloat16 --backend eager --no-speed
                                                  # the same logic on CPU in seconds (what tests/hf runs)

Correctness, per family and dtype, on a small random model (the same weights in float32 on the CPU as the oracle):
- ``fused``: a training step's loss and gradients (the fused path) in the dtype on the device, against float32 on
  the CPU, within the dtype's tolerance;
- ``compiled``: ``torch.compile(model, fullgraph=True)`` (``--backend``) on the device, loss and gradients against
  the same model's eager step;
- ``static``: greedy ``generate`` with the static cache (compiled) against the dynamic cache, float32 on the device:
  the same tokens.
No CUDA device with ``--device cuda``: exit 2 with a message saying so, never a skip.
"""

import argparse
import copy
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from transformers import CompileConfig  # noqa: E402

import bench_hf  # noqa: E402
from bet_fairseq.hf import to_bet  # noqa: E402

TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 6e-2}  # relative to the largest value
# An Inductor compile each (tens of seconds on a GPU machine): GPT-2's Conv1D, per-head q/k norms with grouped
# queries, the fused qkv projection. Static generation: the first two.
COMPILED_FAMILIES = ("gpt2", "qwen3", "phi3")


class CheckFailed(AssertionError):
    pass


def close(name: str, got: torch.Tensor, want: torch.Tensor, dtype) -> float:
    """The largest difference relative to ``want``'s largest value; CheckFailed above the dtype's tolerance."""
    got, want = got.detach().float().cpu(), want.detach().float().cpu()
    error = float((got - want).abs().max() / want.abs().max().clamp(min=1e-6))
    if not error <= TOLERANCE[dtype]:  # NaN fails too
        raise CheckFailed(f"{name}: relative difference {error:.2e} > {TOLERANCE[dtype]:.0e}")
    return error


def small_pair(family: str, seed: int = 0):
    """A small random stock model of ``family`` (2 layers, 64 dims, 4 heads, 2 key-value heads, no dropout) and its
    BET version, float32 on the CPU."""
    torch.manual_seed(seed)
    config = bench_hf.stock_config(family, 2, 64, 4, 2, 256, 128)
    for name in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout"):
        if hasattr(config, name):
            setattr(config, name, 0.0)
    stock = bench_hf.FAMILIES[family](config)
    return stock, to_bet(stock)


def loss_and_grads(model, ids, run=None):
    model.zero_grad(set_to_none=True)
    loss = (model if run is None else run)(ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if n.endswith("bet_w")}


def check_family(family: str, device, dtype, backend: str, compiled: bool, length: int):
    """The fused, compiled and static-cache checks of one family in one dtype; returns the lines to print."""
    _, oracle = small_pair(family)
    ids = torch.randint(0, 256, (2, length))
    want_loss, want_grads = loss_and_grads(oracle.train(), ids)
    bet = copy.deepcopy(oracle).to(device=device, dtype=dtype).train()
    ids_dev = ids.to(device)
    loss, grads = loss_and_grads(bet, ids_dev)
    errors = [close(f"{family} {dtype} fused loss", loss, want_loss, dtype)]
    errors += [close(f"{family} {dtype} fused grad {n}", grads[n], g, dtype) for n, g in want_grads.items()]
    lines = [f"ok fused    {family:8s} {str(dtype):15s} {device}: largest relative difference {max(errors):.1e}"]
    if not compiled:
        return lines
    compiled_loss, compiled_grads = loss_and_grads(bet, ids_dev, torch.compile(bet, fullgraph=True, backend=backend))
    errors = [close(f"{family} {dtype} compiled loss", compiled_loss, loss, dtype)]
    errors += [close(f"{family} {dtype} compiled grad {n}", compiled_grads[n], g, dtype) for n, g in grads.items()]
    lines.append(f"ok compiled {family:8s} {str(dtype):15s} {device} ({backend}): largest relative difference "
                 f"{max(errors):.1e}")
    return lines


def check_static_generation(family: str, device, backend: str):
    _, bet = small_pair(family)
    bet = bet.to(device).eval()
    config = CompileConfig(fullgraph=True, backend=backend, mode="default")
    config._compile_all_devices = True  # transformers compiles generate() on accelerators only, unless told
    prompt = torch.randint(1, 256, (2, 5), device=device)
    options = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        dynamic = bet.generate(prompt, **options)
        static = bet.generate(prompt, cache_implementation="static", compile_config=config, **options)
    if not torch.equal(dynamic, static):
        raise CheckFailed(f"{family}: the compiled static cache generated {static.tolist()}, the dynamic cache "
                          f"{dynamic.tolist()}")
    return f"ok static   {family:8s} float32         {device} ({backend}): greedy tokens equal the dynamic cache's"


def speed(device, dtype: str, quick: bool, backend: str):
    """The speed ratios: BET / stock training step, eager and compiled (``backend``), and static / dynamic generation
    (compiled); GPT-2 small on CUDA, a toy size with ``quick``."""
    size = (["--layers", "2", "--dim", "64", "--heads", "4", "--vocab", "256", "--batch", "2", "--length", "32",
             "--new-tokens", "4", "--reps", "1"] if quick else
            ["--layers", "12", "--dim", "768", "--heads", "12", "--batch", "8", "--length", "512", "--new-tokens",
             "64", "--reps", "3"])
    common = [*size, "--device", str(device), "--dtype", dtype, "--backend", backend]
    results = {}
    for label, extra in (("training, eager", []), ("training, compiled", ["--compile"]),
                         ("generation static / dynamic, compiled", ["--task", "generate", "--compile"])):
        print(f"--- {label}: run/bench_hf.py {' '.join(common + extra)}", flush=True)
        results[label] = bench_hf.main(common + extra)
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtypes", default="float16,bfloat16")
    parser.add_argument("--families", default=",".join(bench_hf.FAMILIES))
    parser.add_argument("--backend", default="inductor", help="torch.compile backend of the compiled checks")
    parser.add_argument("--length", type=int, default=64, help="training length of the correctness checks")
    parser.add_argument("--no-speed", action="store_true", help="correctness only")
    parser.add_argument("--quick", action="store_true", help="the speed runs at a toy size (a dry run)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("check_gpu: FAILED: no CUDA GPU is visible to torch (torch.cuda.is_available() is False, torch "
              f"{torch.__version__}); run this on a machine with a GPU, or pass --device cpu for a dry run",
              file=sys.stderr)
        return 2
    families = [f for f in args.families.split(",") if f]
    unknown = sorted(set(families) - set(bench_hf.FAMILIES))
    if unknown:
        parser.error(f"--families: unknown {', '.join(unknown)}; choose from {', '.join(bench_hf.FAMILIES)}")
    dtypes = [getattr(torch, name) for name in args.dtypes.split(",") if name]
    torch.manual_seed(0)
    failures = []
    for dtype in dtypes:
        for family in families:
            try:
                for line in check_family(family, device, dtype, args.backend, family in COMPILED_FAMILIES,
                                         args.length):
                    print(line, flush=True)
            except Exception as err:  # every check runs; the summary counts them
                failures.append(f"{family} {dtype}: {type(err).__name__}: {err}")
                print(f"FAILED {failures[-1]}", flush=True)
    for family in (f for f in families if f in COMPILED_FAMILIES[:2]):
        try:
            print(check_static_generation(family, device, args.backend), flush=True)
        except Exception as err:
            failures.append(f"{family} static generation: {type(err).__name__}: {err}")
            print(f"FAILED {failures[-1]}", flush=True)
    if failures:
        print(f"check_gpu: FAILED: {len(failures)} check(s):\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    if not args.no_speed:
        for label, ratio in speed(device, "bfloat16" if device.type == "cuda" else "float32", args.quick,
                                  args.backend).items():
            print(f"speed: {label}: {ratio:.3f}")
    print("check_gpu: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
