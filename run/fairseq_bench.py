"""What the whole-model speed benchmarks of fairseq models (``bench_translation.py``, ``bench_lm.py``) share: the
models built through fairseq's own task / model / criterion builders and ``Trainer`` from a recipe, training
timed as ``fairseq-train`` runs it, the peak memory of training steps measured in a fresh process per model, the
command-line options and checks both take, and the lines and files they write.

Timing itself (the clock, alternating repetitions, medians and ratios) is ``bet_fairseq.tools.timing``.
"""

import argparse
import json
import os
import resource
import subprocess
import sys

import torch

import bet_fairseq
from bet_fairseq import recipes
from bet_fairseq.files import atomic_write
from bet_fairseq.tools import timing

USER_DIR = bet_fairseq.user_dir()


def write_dictionary(path, vocab):
    """A fairseq dictionary of ``vocab`` entries in all (fairseq adds <s> <pad> </s> <unk> to the words here)."""
    with open(path, "w", encoding="utf-8") as f:
        for i in range(vocab - 4):
            f.write(f"w{i} {vocab - i}\n")


def build_trainer(data_dir, arch, flags):
    """(cfg, task, trainer) of ``arch`` trained with the recipe ``flags`` on ``data_dir``, built as fairseq-train
    builds them (seed 1 before the model)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    bet_fairseq.register()  # --user-dir skips a package already imported (for recipes, above): register here
    argv = [data_dir, "--user-dir", USER_DIR, "--arch", arch, *recipes.to_argv(flags)]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    cfg = convert_namespace_to_omegaconf(args)
    torch.manual_seed(1)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    return cfg, task, Trainer(cfg, task, model, criterion)


def parameters(trainer):
    return sum(p.numel() for p in trainer.get_model().parameters())


def time_train(trainer, batches, clock):
    """``Trainer.train_step`` (forward, backward, optimizer step) over ``batches``: target tokens per second, as
    fairseq-train's ``wps``."""
    tokens = 0
    with clock.stopwatch() as watch:
        for sample in batches:
            trainer.train_step([sample])
            tokens += int(sample["ntokens"])
    return tokens / watch.seconds


# --------------------------------------------------------------------------------------------- memory
def _proc_status_kib(field):
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def cpu_memory_baseline():
    """(resident KiB now, mode) with the peak-RSS mark reset to now where Linux allows it.

    ru_maxrss is no good alone: Linux keeps it across fork+exec, so a child of a big parent starts
    at the parent's peak. /proc/self/clear_refs "5" resets this process's VmHWM instead.
    """
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
        return _proc_status_kib("VmRSS"), "VmHWM"
    except (OSError, KeyError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "ru_maxrss"


def cpu_peak_rss_kib(mode):
    if mode == "VmHWM":
        return _proc_status_kib("VmHWM")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def training_step_memory(trainer, batches, device):
    """Peak memory of ``trainer.train_step`` over ``batches`` beyond what was held before (MiB): CUDA's
    allocator statistics, or on CPU the growth of the resident set's peak."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        for sample in batches:
            trainer.train_step([sample])
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        return dict(mode="cuda.max_memory_allocated", before_mb=before / 2**20, peak_mb=peak / 2**20,
                    step_mb=(peak - before) / 2**20)
    before, mode = cpu_memory_baseline()
    for sample in batches:
        trainer.train_step([sample])
    peak = cpu_peak_rss_kib(mode)
    return dict(mode=mode, before_mb=before / 1024, peak_mb=peak / 1024, step_mb=(peak - before) / 1024)


# glibc's malloc raises its mmap threshold as large blocks are freed and then keeps freed tensors in the heap,
# so the resident set depends on the allocation history (runs scattered by +-30 %). A fixed threshold
# (which also turns the adjustment off) makes every tensor above 128 KiB its own mapping, returned at once
# when freed: the resident set then follows the memory the tensors actually hold.
MEMORY_ENV = dict(os.environ, PYTHONWARNINGS="ignore", MALLOC_MMAP_THRESHOLD_="131072")
_MEMORY_LINE = "MEMORY_JSON "


def print_memory(result):
    """The ``--memory-child`` process's answer, read back by ``run_memory_child``."""
    print(_MEMORY_LINE + json.dumps(result))


def run_memory_child(cmd, threads, name):
    """Run a ``--memory-child`` command (in a fresh process, so peaks don't mix) and return its answer."""
    if threads:
        cmd = [*cmd, "--threads", str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=MEMORY_ENV)
    for line in proc.stdout.splitlines():
        if line.startswith(_MEMORY_LINE):
            return json.loads(line[len(_MEMORY_LINE):])
    raise RuntimeError(f"memory measurement of {name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


# --------------------------------------------------------------------------------------------- options
def add_common_options(p, sizes, default_size, quick_help, max_tokens_help, generation_only_help):
    """The options both benchmarks take (``bench_speed.py`` takes both benchmarks' options at once)."""
    p.add_argument("--size", choices=sizes, default=default_size)
    p.add_argument("--reps", type=int, default=None, help="repetitions (medians are reported; default 5, "
                   "--quick 1)")
    p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument("--out", help="write speed_SIZE.json and speed_SIZE.md into this folder")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    p.add_argument("--max-tokens", type=int, help=max_tokens_help)
    timing.add_threads_option(p)
    timing.add_clock_option(p)
    p.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    p.add_argument("--generation-only", action="store_true", help=generation_only_help)
    p.add_argument("--json", help="also write all figures to this JSON file")
    p.add_argument("--memory-child", help=argparse.SUPPRESS)


def check_common(p, args):
    """The repetitions' default, the device and clock checked (``p.error``), the threads set; the clock."""
    if args.reps is not None and args.reps < 1:  # before the default below, which would read 0 as "unset"
        p.error("--reps must be >= 1")
    args.reps = args.reps or (1 if args.quick else 5)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available")
    clock = timing.clock_from_args(p, args.clock, args.device)
    timing.set_threads(args.threads)
    return clock


# --------------------------------------------------------------------------------------------- reporting
def progress(what, rep, reps, figures):
    print(f"{what} rep {rep + 1}/{reps}: " + ", ".join(f"{a} {v:.0f} tok/s" for a, v in figures.items()),
          file=sys.stderr, flush=True)


def shown(tokens_per_s, ms_per_token=False):
    """A speed as the table shows it: tokens/s, or milliseconds per token where latency is the point."""
    return f"{1000 / tokens_per_s:.2f}" if ms_per_token else f"{tokens_per_s:.0f}"


def per_run_lines(results, keys, ms_keys):
    """Every repetition's figure per model and measure (tokens/s; ms per token for ``ms_keys``), in the order they
    ran."""
    return [f"per run, {key}{' (ms per token)' if key in ms_keys else ''}: " + "; ".join(
        f"{arch} " + ", ".join(shown(v, key in ms_keys) for v in results[arch][key]) for arch in results)
        for key in keys]


def paired_line(vanilla, bet, keys):
    """The median of the per-repetition ratios (``timing.median_ratio``); the table's ratio, which decides a target,
    is the ratio of the medians."""
    return "median of the per-repetition ratios, BET / vanilla: " + ", ".join(
        f"{key} {timing.median_ratio(vanilla[key], bet[key]):.3f}" for key in keys)


def write_json(path, payload):
    with atomic_write(path) as f:
        json.dump(payload, f, indent=2)


def write_outputs(args, text, payload):
    """``--json FILE`` and ``--out DIR`` (``DIR/speed_{size}.json`` and ``.md``)."""
    if args.json:
        write_json(args.json, payload)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        write_json(os.path.join(args.out, f"speed_{args.size}.json"), payload)
        with atomic_write(os.path.join(args.out, f"speed_{args.size}.md")) as f:
            f.write(text + "\n")
