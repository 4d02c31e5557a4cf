#!/usr/bin/env python
"""BET(SF) vs the vanilla transformer, side by side in one process: training and generation speed,
and the peak memory of a training step.

    python run/bench_speed.py --size iwslt --reps 5            # synthetic IWSLT-shaped batches
    python run/bench_speed.py --size small --data DATA-BIN      # real batches from a data-bin dir

Both models are built through fairseq's task/model/criterion builders with the IWSLT14 recipe's
options (``bet_fairseq/recipes.py``: Adam (0.9, 0.98), inverse_sqrt, label-smoothed cross-entropy 0.1,
dropout 0.3, shared decoder embeddings) and measured on the SAME batches, alternating model order every repetition:

(a) training: ``fairseq.trainer.Trainer.train_step`` (forward, backward, optimizer step, what
    fairseq-train runs), target tokens per second = fairseq-train's ``wps``;
(b) generation: fairseq's ``SequenceGenerator`` (incremental decoding), beam 5, generated tokens
    of the best hypothesis per second = fairseq-generate's ``tokens/s``. Untrained models stop at
    random lengths, so every hypothesis is forced to the same length (min_len = max_len = about
    1.1 x the source length): both models then decode exactly the same number of steps;
(c) peak memory of a training step, in a fresh subprocess per model (``--memory-mode``):
    on CUDA ``torch.cuda.max_memory_allocated`` minus the memory held before the first step; on
    CPU the peak resident set during the training steps (Linux ``VmHWM``, reset just before them
    through ``/proc/self/clear_refs``) minus the resident set before them: activations, gradients
    and optimizer state beyond the weights (``ru_maxrss`` where /proc is missing).

Prints a Markdown table (medians over the repetitions; ratio = BET / vanilla) and the speed targets
(``TARGETS``); ``--json FILE`` writes every repetition's figures too.
"""

import argparse
import contextlib
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DIR = os.path.join(ROOT, "bet_fairseq")
sys.path.insert(0, ROOT)

from bet_fairseq import recipes  # noqa: E402  (the flags: recipes.BENCH_TRAIN, the IWSLT14 recipe)
from bet_fairseq.files import atomic_write  # noqa: E402

# size -> architecture overrides, joint vocabulary of the synthetic data, tokens per batch,
# sentences per generation batch, training / generation batches per repetition.
SIZES = {
    # transformer_iwslt_de_en as it is: 6+6 layers, 512 dim, 4 heads, FFN 1024; ~10k joint BPE.
    # Batches of 2048 tokens (the recipe uses 4096 per GPU) keep a CPU run in minutes; the
    # attention's share of the cost depends on the sentence length, not on the batch size.
    "iwslt": dict(overrides={}, vocab=10000, max_tokens=2048, gen_sentences=16, train_batches=2, gen_batches=2),
    # a CI-sized model: 3+3 layers, 256 dim, 4 heads, FFN 512.
    "small": dict(overrides=recipes.BENCH_SMALL, vocab=4000, max_tokens=2048, gen_sentences=16, train_batches=3,
                  gen_batches=2),
}
(_, VANILLA), (_, BET) = recipes.SIDE_BY_SIDE
TARGETS = {"train": 0.85, "generate": 0.85, "memory": 1.2}


# ---------------------------------------------------------------------------------------------
def synthetic_data_dir(folder, vocab):
    """A data-bin folder holding only dictionaries (the task needs them; batches are made here)."""
    for lang in ("de", "en"):
        with open(os.path.join(folder, f"dict.{lang}.txt"), "w", encoding="utf-8") as f:
            for i in range(vocab - 4):  # fairseq adds <s> <pad> </s> <unk>
                f.write(f"w{i} {vocab - i}\n")
    return folder


def build(arch, data_dir, size, device, src="de", tgt="en", max_tokens=None):
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    import bet_fairseq

    bet_fairseq.register()  # --user-dir skips a package already imported (for recipes, above): register here
    flags = recipes.merge(recipes.BENCH_TRAIN, SIZES[size]["overrides"], {
        "--source-lang": src, "--target-lang": tgt, "--max-tokens": max_tokens or SIZES[size]["max_tokens"],
        "--cpu": device == "cpu"})
    argv = [data_dir, "--user-dir", USER_DIR, "--arch", arch, *recipes.to_argv(flags)]
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, argv)
    cfg = convert_namespace_to_omegaconf(args)
    torch.manual_seed(1)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)
    return cfg, task, trainer


def make_batches(task, size, data_dir_given, subset, n_batches, max_tokens, seed=1):
    """Fixed list of fairseq batches: real ones from ``subset`` or synthetic IWSLT-like ones."""
    from fairseq.data import LanguagePairDataset

    if data_dir_given:
        task.load_dataset(subset)
        dataset = task.dataset(subset)
    else:
        rng = random.Random(seed)
        vocab = len(task.target_dictionary)
        first = task.target_dictionary.nspecial
        src, tgt = [], []
        for _ in range(4000):
            # IWSLT14 De-En with BPE: about 20-25 target tokens on average, long tail to ~100.
            n_tgt = min(100, max(3, int(rng.lognormvariate(3.0, 0.5))))
            n_src = max(3, int(n_tgt * rng.uniform(0.9, 1.25)))
            src.append(torch.tensor([rng.randrange(first, vocab) for _ in range(n_src)] + [2]))
            tgt.append(torch.tensor([rng.randrange(first, vocab) for _ in range(n_tgt)] + [2]))
        dataset = LanguagePairDataset(
            src, [len(s) for s in src], task.source_dictionary, tgt, [len(t) for t in tgt],
            task.target_dictionary, shuffle=True,
        )
    itr = task.get_batch_iterator(
        dataset, max_tokens=max_tokens, max_positions=(1024, 1024), seed=seed,
        ignore_invalid_inputs=True, required_batch_size_multiple=8,
    ).next_epoch_itr(shuffle=True)
    batches = []
    for sample in itr:
        batches.append(sample)
        if len(batches) >= n_batches:
            break
    return batches


def generation_batches(task, batches, n_sentences, n_batches):
    """Source-only batches of ``n_sentences`` taken from the training batches."""
    out = []
    for sample in batches:
        net = sample["net_input"]
        out.append(dict(id=sample["id"][:n_sentences], net_input=dict(
            src_tokens=net["src_tokens"][:n_sentences], src_lengths=net["src_lengths"][:n_sentences])))
        if len(out) >= n_batches:
            break
    return out


def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


CLOCK = time.perf_counter  # --clock cpu: time.process_time


def time_train(trainer, batches, device):
    sync(device)
    start = CLOCK()
    tokens = 0
    for sample in batches:
        trainer.train_step([sample])
        tokens += int(sample["ntokens"])
    sync(device)
    return tokens / (CLOCK() - start)


def time_generate(task, model, gen_batches, beam, device):
    from fairseq import utils
    from fairseq.dataclass.configs import GenerationConfig

    model.eval()
    tokens, elapsed = 0, 0.0
    for sample in gen_batches:
        length = max(2, int(1.1 * float(sample["net_input"]["src_lengths"].float().mean())))
        gen_cfg = GenerationConfig(beam=beam, max_len_a=0, max_len_b=length, min_len=length)
        generator = task.build_generator([model], gen_cfg)
        if device.startswith("cuda"):
            sample = utils.move_to_cuda(sample)
        sync(device)
        start = CLOCK()
        hypos = task.inference_step(generator, [model], sample)
        sync(device)
        elapsed += CLOCK() - start
        tokens += sum(len(h[0]["tokens"]) for h in hypos)  # as fairseq-generate counts
    model.train()
    return tokens / elapsed


# ---------------------------------------------------------------------------------------------
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


def memory_child(args):
    """Fresh process, one model: peak memory of training steps beyond what was held before."""
    data_dir, cleanup = resolve_data(args)
    with cleanup:
        cfg, task, trainer = build(args.memory_child, data_dir, args.size, args.device,
                                   max_tokens=args.max_tokens)
        batches = make_batches(task, args.size, bool(args.data), args.subset,
                               SIZES[args.size]["train_batches"], args.max_tokens or SIZES[args.size]["max_tokens"])
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            for sample in batches:
                trainer.train_step([sample])
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
            result = dict(mode="cuda.max_memory_allocated", before_mb=before / 2**20,
                          peak_mb=peak / 2**20, step_mb=(peak - before) / 2**20)
        else:
            before, mode = cpu_memory_baseline()
            for sample in batches:
                trainer.train_step([sample])
            peak = cpu_peak_rss_kib(mode)
            result = dict(mode=mode, before_mb=before / 1024, peak_mb=peak / 1024,
                          step_mb=(peak - before) / 1024)
    print("MEMORY_JSON " + json.dumps(result))


def measure_memory(args, arch):
    cmd = [sys.executable, os.path.abspath(__file__), "--memory-child", arch, "--size", args.size,
           "--device", args.device, "--subset", args.subset]
    if args.data:
        cmd += ["--data", args.data]
    if args.max_tokens:
        cmd += ["--max-tokens", str(args.max_tokens)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    for line in proc.stdout.splitlines():
        if line.startswith("MEMORY_JSON "):
            return json.loads(line[len("MEMORY_JSON "):])
    raise RuntimeError(f"memory measurement of {arch} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def resolve_data(args):
    if args.data:
        if not os.path.isfile(os.path.join(args.data, f"dict.{args.source_lang}.txt")):
            sys.exit(f"--data {args.data}: no dict.{args.source_lang}.txt there (a fairseq-preprocess output folder?)")
        return args.data, contextlib.nullcontext()
    tmp = tempfile.TemporaryDirectory(prefix="bet_bench_")
    return synthetic_data_dir(tmp.name, SIZES[args.size]["vocab"]), tmp


# ---------------------------------------------------------------------------------------------
def run(args):
    data_dir, cleanup = resolve_data(args)
    with cleanup:
        models = {}
        for arch in (VANILLA, BET):
            cfg, task, trainer = build(arch, data_dir, args.size, args.device, args.source_lang,
                                       args.target_lang, args.max_tokens)
            models[arch] = (task, trainer)
        task = models[VANILLA][0]
        spec = SIZES[args.size]
        batches = make_batches(task, args.size, bool(args.data), args.subset, spec["train_batches"],
                               args.max_tokens or spec["max_tokens"])
        gen_batches = generation_batches(task, batches, spec["gen_sentences"], spec["gen_batches"])
        results = {arch: dict(train=[], generate=[]) for arch in models}
        # warm-up: one step and one generation each (allocations, optimizer state, kernels)
        for arch, (task_a, trainer) in models.items():
            trainer.train_step([batches[0]])
            time_generate(task_a, trainer.get_model(), gen_batches[:1], args.beam, args.device)
        for rep in range(args.reps):
            order = list(models) if rep % 2 == 0 else list(models)[::-1]
            for arch in order:
                task_a, trainer = models[arch]
                results[arch]["train"].append(time_train(trainer, batches, args.device))
            for arch in order:
                task_a, trainer = models[arch]
                results[arch]["generate"].append(
                    time_generate(task_a, trainer.get_model(), gen_batches, args.beam, args.device))
            print(f"rep {rep + 1}/{args.reps}: " + ", ".join(
                f"{a} train {results[a]['train'][-1]:.0f} gen {results[a]['generate'][-1]:.0f} tok/s"
                for a in models), file=sys.stderr, flush=True)
        info = dict(
            size=args.size, device=args.device, clock=args.clock, threads=torch.get_num_threads(), reps=args.reps,
            train_batches=len(batches), train_target_tokens=sum(int(b["ntokens"]) for b in batches),
            gen_sentences=sum(len(b["id"]) for b in gen_batches), beam=args.beam,
            data=args.data or "synthetic", torch=torch.__version__,
            params={a: sum(p.numel() for p in t.get_model().parameters()) for a, (_, t) in models.items()},
        )
    del models
    if not args.no_memory:
        for arch in (VANILLA, BET):
            results[arch]["memory"] = measure_memory(args, arch)
    return info, results


def table(info, results):
    med = {a: {k: statistics.median(v) for k, v in r.items() if k in ("train", "generate")} for a, r in results.items()}
    rows = ["| measure | transformer_iwslt_de_en | bet_sf_iwslt | ratio (BET / vanilla) | target | met |",
            "|---|---|---|---|---|---|"]
    verdict = {}
    for key, label in (("train", "training, target tokens/s (wps)"), ("generate", f"generation beam {info['beam']}, tokens/s")):
        ratio = med[BET][key] / med[VANILLA][key]
        verdict[key] = ratio >= TARGETS[key]
        rows.append(f"| {label} | {med[VANILLA][key]:.0f} | {med[BET][key]:.0f} | {ratio:.3f} | >= {TARGETS[key]} | "
                    f"{'yes' if verdict[key] else 'NO'} |")
    if "memory" in results[VANILLA]:
        mv, mb = results[VANILLA]["memory"], results[BET]["memory"]
        ratio = mb["step_mb"] / mv["step_mb"]
        verdict["memory"] = ratio <= TARGETS["memory"]
        rows.append(f"| training-step memory, MiB ({mv['mode']} growth) | {mv['step_mb']:.0f} | {mb['step_mb']:.0f} | "
                    f"{ratio:.3f} | <= {TARGETS['memory']} | {'yes' if verdict['memory'] else 'NO'} |")
        rows.append(f"| peak process memory, MiB (for reference) | {mv['peak_mb']:.0f} | {mb['peak_mb']:.0f} | "
                    f"{mb['peak_mb'] / mv['peak_mb']:.3f} | | |")
    best = {a: {k: max(v) for k, v in r.items() if k in ("train", "generate")} for a, r in results.items()}
    rows.append("")
    rows.append("best repetition (least disturbed by other load), BET / vanilla: " + ", ".join(
        f"{key} {best[BET][key] / best[VANILLA][key]:.3f}" for key in ("train", "generate")))
    head = (f"size={info['size']} device={info['device']} clock={info['clock']} threads={info['threads']} reps={info['reps']} "
            f"data={info['data']} train: {info['train_batches']} batches, {info['train_target_tokens']} target tokens; "
            f"generate: {info['gen_sentences']} sentences, beam {info['beam']}; torch {info['torch']}; "
            f"parameters: vanilla {info['params'][VANILLA]:,}, BET {info['params'][BET]:,}")
    return head + "\n\n" + "\n".join(rows), med, verdict


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", choices=sorted(SIZES), default="iwslt")
    p.add_argument("--reps", type=int, default=5, help="repetitions (medians are reported)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    p.add_argument("--data", help="fairseq-preprocess output folder (default: synthetic IWSLT-like batches)")
    p.add_argument("--subset", default="train", help="split of --data to take batches from")
    p.add_argument("--source-lang", default="de")
    p.add_argument("--target-lang", default="en")
    p.add_argument("--max-tokens", type=int, help="tokens per training batch (default per --size)")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall: elapsed time, as fairseq reports it; cpu: this process's CPU time "
                   "(all its threads), steadier when other jobs share the machine")
    p.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    p.add_argument("--json", help="also write all figures to this JSON file")
    p.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be >= 1")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available")
    if args.clock == "cpu" and args.device.startswith("cuda"):
        p.error("--clock cpu measures CPU time; use --clock wall with --device cuda")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_child:
        return memory_child(args)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    info, results = run(args)
    text, med, verdict = table(info, results)
    print(text)
    if args.json:
        ratios = {k: med[BET][k] / med[VANILLA][k] for k in ("train", "generate")}
        with atomic_write(args.json) as f:
            json.dump(dict(info=info, results=results, medians=med, median_ratios=ratios, targets=TARGETS,
                           met=verdict), f, indent=2)


if __name__ == "__main__":
    main()
