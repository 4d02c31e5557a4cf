#!/usr/bin/env python
"""BET(SF) vs the vanilla transformer, side by side in one process: training and generation speed,
and the peak memory of a training step.

    python run/bench_speed.py --size iwslt --reps 5            # synthetic IWSLT-shaped batches
    python run/bench_speed.py --size small --data DATA-BIN      # real batches from a data-bin dir
    python run/bench_speed.py --size lm_enwik8 --block 128,512,1024 --reps 5 --out DIR   # language models
    python run/bench_speed.py --size lm_enwik8 --quick --out DIR   # one repetition, block 128, minutes

Language-model sizes (``lm``, ``lm_wikitext103``, ``lm_enwik8``: ``vanilla_{size}`` vs ``bet_sf_{size}``, the
Table 2 LM recipe, ``bet_fairseq/recipes.py``; ``lm_tiny``: 2 layers of 32 for tests; ``lm_study``: the model of
``bet-reproduce``'s cpu scale, 3 layers of 128 with adaptive softmax, on WikiText-2's vocabulary) are measured per block
length (``--block``) on the same random token blocks: (a) training, ``Trainer.train_step``, tokens/s; (b)
eval-lm, the model's forward without gradients plus the log-softmax (what fairseq-eval-lm scores), tokens/s;
(c) sampling, token-by-token decoding with the incremental state (``--sample-batch`` random prompts of
``--prompt`` tokens fed token by token, untimed, then ``--new-tokens`` timed greedy steps), new tokens/s; (d) peak
training memory as (c) below. All eval-lm, then all sampling repetitions run before the first training step (as
fairseq-eval-lm runs, and as generation below).

Both models are built through fairseq's task/model/criterion builders with the IWSLT14 recipe's
options (``bet_fairseq/recipes.py``: Adam (0.9, 0.98), inverse_sqrt, label-smoothed cross-entropy 0.1,
dropout 0.3, shared decoder embeddings) and measured on the SAME batches, alternating model order every repetition:

(a) training: ``fairseq.trainer.Trainer.train_step`` (forward, backward, optimizer step, what
    fairseq-train runs), target tokens per second = fairseq-train's ``wps``;
(b) generation: fairseq's ``SequenceGenerator`` (incremental decoding), beam 5, generated tokens
    of the best hypothesis per second = fairseq-generate's ``tokens/s``. Untrained models stop at
    random lengths, so every hypothesis is forced to the same length (min_len = max_len = about
    1.1 x the source length): both models then decode exactly the same number of steps. All generation
    repetitions run before the first training step, in a process that has not trained yet, as
    fairseq-generate runs;
(b') generation as the issue measured fairseq-generate: ``--gen-sentences`` (200) source sentences in the batches
    fairseq-generate builds with ``--batch-size`` (``--gen-batch-size`` 50: its iterator, length-sorted, sizes a
    multiple of 8), every hypothesis forced to ``--forced-len`` (30) tokens, beam 5, tokens/s; and one sentence at a
    time (batch 1, ``--latency-sentences``: interactive latency, ms per token). Language models: sampling also
    with one sequence (batch 1, ms per token). ``--generation-only`` skips training and memory;
(c) peak memory of a training step, in a fresh subprocess per model (``--memory-mode``):
    on CUDA ``torch.cuda.max_memory_allocated`` minus the memory held before the first step; on
    CPU the peak resident set during the training steps (Linux ``VmHWM``, reset just before them
    through ``/proc/self/clear_refs``) minus the resident set before them: activations, gradients
    and optimizer state beyond the weights (``ru_maxrss`` where /proc is missing).

Prints a Markdown table (medians over the repetitions; ratio = BET / vanilla) and the speed targets
(``TARGETS``, ``LM_TARGETS``); ``--json FILE`` writes every repetition's figures too; ``--out DIR`` writes
``DIR/speed_{size}.json`` and ``DIR/speed_{size}.md``.
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

import bet_fairseq
from bet_fairseq import catalog, recipes  # the flags (recipes.BENCH_TRAIN, the IWSLT14 recipe), the arch names
from bet_fairseq.files import atomic_write
from bet_fairseq.tools.study import plan as study_plan  # the study's model sizes (size lm_study)

USER_DIR = bet_fairseq.user_dir()

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
TARGETS = {"train": 0.95, "generate": 0.95, "generate_forced": 0.95, "latency": 0.95, "memory": 1.10}
# size -> Table 2 dataset (the LM recipe), vocabulary of the synthetic dictionary, extra architecture flags
LM_SIZES = {
    "lm": dict(dataset="wikitext2", vocab=33278, overrides={}),
    "lm_wikitext103": dict(dataset="wikitext103", vocab=267735, overrides={}),
    "lm_enwik8": dict(dataset="enwik8", vocab=205, overrides={}),
    "lm_tiny": dict(dataset="enwik8", vocab=205, overrides=recipes.lm_sizes(2, 32, 64, 4)),
    # bet-reproduce's cpu-scale language model: 3 layers of 128, adaptive softmax (2000,10000), WikiText-2's vocabulary
    "lm_study": dict(dataset="wikitext2", vocab=33278, overrides=study_plan.SCALE_TABLE["cpu"].train["lm"]),
}
LM_TARGETS = {"train": 0.90, "eval_lm": 0.90, "sample": 0.95, "sample_b1": 0.95, "memory": 1.15}


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


def synthetic_pairs(task, n=4000, seed=1):
    """``n`` random sentence pairs with IWSLT14-like BPE lengths (about 20-25 target tokens, a tail to 100)."""
    from fairseq.data import LanguagePairDataset

    rng = random.Random(seed)
    vocab = len(task.target_dictionary)
    first = task.target_dictionary.nspecial
    src, tgt = [], []
    for _ in range(n):
        n_tgt = min(100, max(3, int(rng.lognormvariate(3.0, 0.5))))
        n_src = max(3, int(n_tgt * rng.uniform(0.9, 1.25)))
        src.append(torch.tensor([rng.randrange(first, vocab) for _ in range(n_src)] + [2]))
        tgt.append(torch.tensor([rng.randrange(first, vocab) for _ in range(n_tgt)] + [2]))
    return LanguagePairDataset(src, [len(s) for s in src], task.source_dictionary, tgt, [len(t) for t in tgt],
                               task.target_dictionary, shuffle=True)


def make_batches(task, size, data_dir_given, subset, n_batches, max_tokens, seed=1):
    """Fixed list of fairseq batches: real ones from ``subset`` or synthetic IWSLT-like ones."""
    if data_dir_given:
        task.load_dataset(subset)
        dataset = task.dataset(subset)
    else:
        dataset = synthetic_pairs(task, seed=seed)
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


def fairseq_generate_batches(task, data_dir_given, subset, sentences, batch_size, seed=2):
    """The first ``sentences`` source sentences of ``subset`` (synthetic ones without --data) batched as
    fairseq-generate batches them with ``--batch-size``: its own iterator, length-sorted, batch sizes a multiple
    of fairseq's default ``--required-batch-size-multiple`` (so --batch-size 50 gives batches of 48)."""
    from fairseq.data import LanguagePairDataset
    from fairseq.dataclass.configs import DatasetConfig

    if data_dir_given:
        task.load_dataset(subset)
        full = task.dataset(subset)
    else:
        full = synthetic_pairs(task, sentences, seed=seed)
    n = min(sentences, len(full))
    src = [full.src[i] for i in range(n)]
    dataset = LanguagePairDataset(src, [len(t) for t in src], task.source_dictionary, shuffle=False)
    itr = task.get_batch_iterator(dataset, max_sentences=batch_size, max_positions=(1024, 1024),
                                  ignore_invalid_inputs=True,
                                  required_batch_size_multiple=DatasetConfig.required_batch_size_multiple)
    return list(itr.next_epoch_itr(shuffle=False))


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


def time_generate(task, model, gen_batches, beam, device, length=None):
    """Generated tokens of the best hypotheses per second (fairseq-generate's tokens/s), every hypothesis forced to
    ``length`` tokens (default: 1.1 x the batch's mean source length)."""
    from fairseq import utils
    from fairseq.dataclass.configs import GenerationConfig

    model.eval()
    tokens, elapsed = 0, 0.0
    forced = length
    for sample in gen_batches:
        length = forced or max(2, int(1.1 * float(sample["net_input"]["src_lengths"].float().mean())))
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


def memory_child(args):
    """Fresh process, one model: peak memory of training steps beyond what was held before."""
    data_dir, cleanup = resolve_data(args)
    with cleanup:
        cfg, task, trainer = build(args.memory_child, data_dir, args.size, args.device,
                                   max_tokens=args.max_tokens)
        batches = make_batches(task, args.size, bool(args.data), args.subset,
                               SIZES[args.size]["train_batches"], args.max_tokens or SIZES[args.size]["max_tokens"])
        result = training_step_memory(trainer, batches, args.device)
    print("MEMORY_JSON " + json.dumps(result))


# glibc's malloc raises its mmap threshold as large blocks are freed and then keeps freed tensors in the heap,
# so the resident set depends on the allocation history (runs scattered by +-30 %). A fixed threshold
# (which also turns the adjustment off) makes every tensor above 128 KiB its own mapping, returned at once
# when freed: the resident set then follows the memory the tensors actually hold.
MEMORY_ENV = dict(os.environ, PYTHONWARNINGS="ignore", MALLOC_MMAP_THRESHOLD_="131072")


def measure_memory(args, arch):
    cmd = [sys.executable, os.path.abspath(__file__), "--memory-child", arch, "--size", args.size,
           "--device", args.device, "--subset", args.subset]
    if args.data:
        cmd += ["--data", args.data]
    if args.max_tokens:
        cmd += ["--max-tokens", str(args.max_tokens)]
    return run_memory_child(cmd, args, arch)


def run_memory_child(cmd, args, name):
    """Run a ``--memory-child`` command (in a fresh process, so peaks don't mix) and return its MEMORY_JSON."""
    if args.threads:
        cmd = [*cmd, "--threads", str(args.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=MEMORY_ENV)
    for line in proc.stdout.splitlines():
        if line.startswith("MEMORY_JSON "):
            return json.loads(line[len("MEMORY_JSON "):])
    raise RuntimeError(f"memory measurement of {name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def resolve_data(args):
    if args.data:
        if not os.path.isfile(os.path.join(args.data, f"dict.{args.source_lang}.txt")):
            sys.exit(f"--data {args.data}: no dict.{args.source_lang}.txt there (a fairseq-preprocess output folder?)")
        return args.data, contextlib.nullcontext()
    tmp = tempfile.TemporaryDirectory(prefix="bet_bench_")
    return synthetic_data_dir(tmp.name, SIZES[args.size]["vocab"]), tmp


# ---------------------------------------------------------------------------------------------
def alternate(models, rep):
    """The models' names, in reverse order every other repetition."""
    names = list(models)
    return names if rep % 2 == 0 else names[::-1]


def progress(what, rep, reps, figures):
    print(f"{what} rep {rep + 1}/{reps}: " + ", ".join(f"{a} {v:.0f} tok/s" for a, v in figures.items()),
          file=sys.stderr, flush=True)


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
        results = {arch: dict(train=[], generate=[], generate_forced=[], latency=[]) for arch in models}
        # Generation first, in a process that has not trained yet, as fairseq-generate runs; measured against
        # the interleaved order in docs/performance.md ("Third round"), inside the noise.
        for arch, (task_a, trainer) in models.items():  # warm-up
            time_generate(task_a, trainer.get_model(), gen_batches[:1], args.beam, args.device)
        for rep in range(args.reps):
            for arch in alternate(models, rep):
                task_a, trainer = models[arch]
                results[arch]["generate"].append(
                    time_generate(task_a, trainer.get_model(), gen_batches, args.beam, args.device))
            progress("generation", rep, args.reps, {a: results[a]["generate"][-1] for a in models})
        # as the issue measured fairseq-generate (--batch-size 50, every hypothesis forced to --forced-len tokens),
        # and one sentence at a time (interactive latency)
        forced_batches = {key: fairseq_generate_batches(task, bool(args.data), args.gen_subset, sentences, size)
                          for key, sentences, size in (("generate_forced", args.gen_sentences, args.gen_batch_size),
                                                       ("latency", args.latency_sentences, 1)) if sentences}
        for key, measured in forced_batches.items():
            for rep in range(args.reps):
                for arch in alternate(models, rep):
                    task_a, trainer = models[arch]
                    results[arch][key].append(time_generate(task_a, trainer.get_model(), measured, args.beam,
                                                            args.device, args.forced_len))
                progress(key, rep, args.reps, {a: results[a][key][-1] for a in models})
        for _, trainer in models.values() if not args.generation_only else ():  # warm-up: optimizer state
            trainer.train_step([batches[0]])
        for rep in range(args.reps if not args.generation_only else 0):
            for arch in alternate(models, rep):
                results[arch]["train"].append(time_train(models[arch][1], batches, args.device))
            progress("training", rep, args.reps, {a: results[a]["train"][-1] for a in models})
        info = dict(
            size=args.size, device=args.device, clock=args.clock, threads=torch.get_num_threads(), reps=args.reps,
            train_batches=len(batches), train_target_tokens=sum(int(b["ntokens"]) for b in batches),
            gen_sentences=sum(len(b["id"]) for b in gen_batches), beam=args.beam, forced_len=args.forced_len,
            forced_batches={k: [len(b["id"]) for b in v] for k, v in forced_batches.items()},
            data=args.data or "synthetic", torch=torch.__version__,
            params={a: sum(p.numel() for p in t.get_model().parameters()) for a, (_, t) in models.items()},
        )
    del models
    if not (args.no_memory or args.generation_only):
        for arch in (VANILLA, BET):
            results[arch]["memory"] = measure_memory(args, arch)
    return info, results


MEASURES = ("train", "generate", "generate_forced", "latency")
MS_PER_TOKEN = {"latency", "sample_b1"}  # measured in tokens/s like the others, shown as ms per token


def shown(key, tokens_per_s):
    return f"{1000 / tokens_per_s:.2f}" if key in MS_PER_TOKEN else f"{tokens_per_s:.0f}"


def table(info, results):
    med = {a: {k: statistics.median(v) for k, v in r.items() if k in MEASURES and v} for a, r in results.items()}
    keys = [k for k in MEASURES if k in med[VANILLA]]
    rows = ["| measure | transformer_iwslt_de_en | bet_sf_iwslt | ratio (BET / vanilla) | target | met |",
            "|---|---|---|---|---|---|"]
    forced = info.get("forced_batches", {})
    labels = dict(train="training, target tokens/s (wps)", generate=f"generation beam {info['beam']}, tokens/s",
                  generate_forced=f"generation beam {info['beam']}, {info.get('forced_len')} tokens forced, "
                                  f"{sum(forced.get('generate_forced', []))} sentences in fairseq-generate's "
                                  f"batches, tokens/s",
                  latency=f"batch 1, beam {info['beam']}, {info.get('forced_len')} tokens forced, ms per token")
    verdict = {}
    for key in keys:
        ratio = med[BET][key] / med[VANILLA][key]
        verdict[key] = ratio >= TARGETS[key]
        rows.append(f"| {labels[key]} | {shown(key, med[VANILLA][key])} | {shown(key, med[BET][key])} | "
                    f"{ratio:.3f} | >= {TARGETS[key]} | {'yes' if verdict[key] else 'NO'} |")
    if "memory" in results[VANILLA]:
        mv, mb = results[VANILLA]["memory"], results[BET]["memory"]
        ratio = mb["step_mb"] / mv["step_mb"]
        verdict["memory"] = ratio <= TARGETS["memory"]
        rows.append(f"| training-step memory, MiB ({mv['mode']} growth) | {mv['step_mb']:.0f} | {mb['step_mb']:.0f} | "
                    f"{ratio:.3f} | <= {TARGETS['memory']} | {'yes' if verdict['memory'] else 'NO'} |")
        rows.append(f"| peak process memory, MiB (for reference) | {mv['peak_mb']:.0f} | {mb['peak_mb']:.0f} | "
                    f"{mb['peak_mb'] / mv['peak_mb']:.3f} | | |")
    best = {a: {k: max(v) for k, v in r.items() if k in keys} for a, r in results.items()}
    rows.append("")
    rows.append("best repetition (least disturbed by other load), BET / vanilla: " + ", ".join(
        f"{key} {best[BET][key] / best[VANILLA][key]:.3f}" for key in keys))
    rows.append(paired_line(results[VANILLA], results[BET], keys))
    rows.extend(per_run_lines(results, keys))
    head = (f"size={info['size']} device={info['device']} clock={info['clock']} threads={info['threads']} reps={info['reps']} "
            f"data={info['data']} train: {info['train_batches']} batches, {info['train_target_tokens']} target tokens; "
            f"generate: {info['gen_sentences']} sentences, beam {info['beam']}; torch {info['torch']}; "
            f"parameters: vanilla {info['params'][VANILLA]:,}, BET {info['params'][BET]:,}")
    return head + "\n\n" + "\n".join(rows), med, verdict


def per_run_lines(results, keys):
    """Every repetition's figure per model and measure (tokens/s; ms per token where the table shows that), in
    the order they ran."""
    return [f"per run, {key}{' (ms per token)' if key in MS_PER_TOKEN else ''}: " + "; ".join(
        f"{arch} " + ", ".join(shown(key, v) for v in results[arch][key]) for arch in results) for key in keys]


def paired_line(vanilla, bet, keys):
    """The median of the per-repetition ratios: each repetition ran both models back to back, so on a machine
    whose speed drifts it is steadier than the ratio of the medians (the table's ratio, which decides a target)."""
    return "median of the per-repetition ratios, BET / vanilla: " + ", ".join(
        f"{key} {statistics.median(b / v for v, b in zip(vanilla[key], bet[key])):.3f}" for key in keys)


# --------------------------------------------------------------------------------------------- language models
def lm_arch(row, size):
    """The row's architecture on the size's dataset (``lm_tiny``: enwik8's, shrunk by its overrides)."""
    return catalog.row(row).arch(LM_SIZES[size]["dataset"])


def build_lm(row, data_dir, size, device, block, max_tokens):
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    import bet_fairseq

    bet_fairseq.register()
    spec = LM_SIZES[size]
    flags = recipes.for_softmax(recipes.merge(recipes.train_recipe(spec["dataset"]), spec["overrides"], {
        "--tokens-per-sample": block, "--batch-size": None, "--max-tokens": max_tokens, "--log-format": "none",
        "--num-workers": 0, "--cpu": device == "cpu", "--max-epoch": None, "--patience": None}))
    argv = [data_dir, "--user-dir", USER_DIR, "--arch", lm_arch(row, size), *recipes.to_argv(flags)]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    cfg = convert_namespace_to_omegaconf(args)
    torch.manual_seed(1)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    return task, trainer


def lm_data_dir(folder, vocab):
    with open(os.path.join(folder, "dict.txt"), "w", encoding="utf-8") as f:
        for i in range(vocab - 4):
            f.write(f"w{i} {vocab - i}\n")
    return folder


def lm_batches(task, block, max_tokens, n_batches, seed=1):
    """Random token blocks as fairseq's language_modeling task batches them (no padding)."""
    g = torch.Generator().manual_seed(seed)
    vocab, first = len(task.target_dictionary), task.target_dictionary.nspecial
    rows = max(1, max_tokens // block)
    out = []
    for _ in range(n_batches):
        tokens = torch.randint(first, vocab, (rows, block + 1), generator=g)
        out.append(dict(id=torch.arange(rows), nsentences=rows, ntokens=rows * block,
                        net_input=dict(src_tokens=tokens[:, :-1].contiguous(), src_lengths=torch.full((rows,), block)),
                        target=tokens[:, 1:].contiguous()))
    return out


def lm_prompts(task, n, length, seed=3):
    """``n`` random prompts of ``length`` tokens, (n, length): the same sampling workload at every block length
    (the rows of a training batch were ``--max-tokens`` / block of them: 4 at block 512, 2 at 1024)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(task.target_dictionary.nspecial, len(task.target_dictionary), (n, length), generator=g)


def time_eval_lm(model, batches, device):
    model.eval()
    tokens, elapsed = 0, 0.0
    with torch.no_grad():
        for sample in batches:
            sync(device)
            start = CLOCK()
            out = model(**sample["net_input"])
            model.get_normalized_probs(out, log_probs=True).gather(-1, sample["target"].unsqueeze(-1))
            sync(device)
            elapsed += CLOCK() - start
            tokens += int(sample["ntokens"])
    model.train()
    return tokens / elapsed


def time_sample(model, prompt, new_tokens, device, first_word):
    """Greedy decoding with the incremental state: the ``prompt`` (B, P) fed one token a call, untimed (fairseq's
    decoder takes only the last token once it has an incremental state, so a prefix goes in token by token, as
    fairseq's generator feeds one), then ``new_tokens`` timed steps; new tokens per second. Each step takes the
    most likely word from index ``first_word`` on: an untrained model often prefers padding or </s>, and a padding
    token would bring key padding masks into every later step of one model and not of the other."""
    model.eval()
    state = {}
    with torch.no_grad():
        for end in range(1, prompt.size(1) + 1):
            out, _ = model.decoder(prompt[:, :end], incremental_state=state)
        tokens = prompt
        sync(device)
        start = CLOCK()
        for _ in range(new_tokens):
            nxt = out[:, -1, first_word:].argmax(-1, keepdim=True) + first_word
            tokens = torch.cat([tokens, nxt], dim=1)
            out, _ = model.decoder(tokens, incremental_state=state)
        sync(device)
        elapsed = CLOCK() - start
    model.train()
    return prompt.size(0) * new_tokens / elapsed


def lm_memory_child(args):
    block = int(args.block)
    with tempfile.TemporaryDirectory(prefix="bet_bench_") as tmp:
        task, trainer = build_lm(args.memory_child, lm_data_dir(tmp, LM_SIZES[args.size]["vocab"]), args.size,
                                 args.device, block, args.max_tokens)
        batches = lm_batches(task, block, args.max_tokens, args.train_batches)
        trainer.train_step([batches[0]])  # optimizer state, as in the timed runs
        result = training_step_memory(trainer, batches, args.device)
    print("MEMORY_JSON " + json.dumps(result))


def measure_lm_memory(args, row, block):
    cmd = [sys.executable, os.path.abspath(__file__), "--memory-child", row, "--size", args.size, "--device",
           args.device, "--block", str(block), "--max-tokens", str(args.max_tokens), "--train-batches",
           str(args.train_batches)]
    return run_memory_child(cmd, args, row)


def run_lm(args):
    rows = ("vanilla", "bet_sf")
    results = {}
    with tempfile.TemporaryDirectory(prefix="bet_bench_") as tmp:
        data_dir = lm_data_dir(tmp, LM_SIZES[args.size]["vocab"])
        for block in args.blocks:
            models = {row: build_lm(row, data_dir, args.size, args.device, block, args.max_tokens) for row in rows}
            task = models["vanilla"][0]
            batches = lm_batches(task, block, args.max_tokens, args.train_batches)
            eval_batches = lm_batches(task, block, args.max_tokens, args.train_batches, seed=2)
            prompt = lm_prompts(task, args.sample_batch, min(args.prompt, block))
            first_word = task.target_dictionary.nspecial
            res = {row: dict(train=[], eval_lm=[], sample=[], sample_b1=[]) for row in rows}
            # eval-lm and sampling first, in a process that has not trained yet (as fairseq-eval-lm runs), like
            # generation for translation
            for row, (_, trainer) in models.items():  # warm-up
                time_eval_lm(trainer.get_model(), eval_batches[:1], args.device)
                time_sample(trainer.get_model(), prompt, 2, args.device, first_word)
            measures = (("eval_lm", lambda m: time_eval_lm(m, eval_batches, args.device)),
                        ("sample", lambda m: time_sample(m, prompt, args.new_tokens, args.device, first_word)),
                        ("sample_b1", lambda m: time_sample(m, prompt[:1], args.new_tokens, args.device, first_word)))
            for key, measure in measures:
                for rep in range(args.reps):
                    for row in alternate(rows, rep):
                        res[row][key].append(measure(models[row][1].get_model()))
                    progress(f"block {block} {key}", rep, args.reps, {row: res[row][key][-1] for row in rows})
            for _, trainer in models.values() if not args.generation_only else ():  # warm-up: optimizer state
                trainer.train_step([batches[0]])
            for rep in range(args.reps if not args.generation_only else 0):
                for row in alternate(rows, rep):
                    res[row]["train"].append(time_train(models[row][1], batches, args.device))
                progress(f"block {block} train", rep, args.reps, {row: res[row]["train"][-1] for row in rows})
            params = {row: sum(p.numel() for p in t.get_model().parameters()) for row, (_, t) in models.items()}
            del models
            if not (args.no_memory or args.generation_only):
                for row in rows:
                    res[row]["memory"] = measure_lm_memory(args, row, block)
            results[str(block)] = res
    info = dict(size=args.size, archs=[lm_arch(r, args.size) for r in rows], device=args.device, clock=args.clock,
                threads=torch.get_num_threads(), reps=args.reps, blocks=args.blocks, max_tokens=args.max_tokens,
                train_batches=args.train_batches, prompt=args.prompt, new_tokens=args.new_tokens,
                sample_batch=args.sample_batch, torch=torch.__version__, params=params)
    return info, results


def lm_table(info, results):
    vanilla, bet = info["archs"]
    lines = [f"| block | measure | {vanilla} | {bet} | ratio (BET / vanilla) | target | met |",
             "|---|---|---|---|---|---|---|"]
    medians, ratios, met = {}, {}, {}
    labels = dict(train="training, tokens/s", eval_lm="eval-lm (forward, no grad), tokens/s",
                  sample=f"sampling ({info['new_tokens']} tokens after {info['prompt']}, incremental), tokens/s",
                  sample_b1="sampling one sequence (batch 1), ms per token")
    for block, res in results.items():
        med = {row: {k: statistics.median(v) for k, v in r.items() if k != "memory" and v} for row, r in res.items()}
        medians[block], ratios[block], met[block] = med, {}, {}
        measured = [key for key in labels if key in med["vanilla"]]
        for key in measured:
            label = labels[key]
            ratio = med["bet_sf"][key] / med["vanilla"][key]
            ratios[block][key], met[block][key] = ratio, ratio >= LM_TARGETS[key]
            lines.append(f"| {block} | {label} | {shown(key, med['vanilla'][key])} | {shown(key, med['bet_sf'][key])} | "
                         f"{ratio:.3f} | "
                         f">= {LM_TARGETS[key]} | {'yes' if met[block][key] else 'NO'} |")
        if "memory" in res["vanilla"]:
            mv, mb = res["vanilla"]["memory"], res["bet_sf"]["memory"]
            ratio = mb["step_mb"] / mv["step_mb"]
            ratios[block]["memory"], met[block]["memory"] = ratio, ratio <= LM_TARGETS["memory"]
            lines.append(f"| {block} | training-step memory, MiB ({mv['mode']} growth) | {mv['step_mb']:.0f} | "
                         f"{mb['step_mb']:.0f} | {ratio:.3f} | <= {LM_TARGETS['memory']} | "
                         f"{'yes' if met[block]['memory'] else 'NO'} |")
        lines.append(f"block {block}: " + paired_line(res["vanilla"], res["bet_sf"], measured))
        lines.extend(f"block {block}: {line}" for line in per_run_lines(res, measured))
    head = (f"size={info['size']} device={info['device']} clock={info['clock']} threads={info['threads']} "
            f"reps={info['reps']} blocks={','.join(map(str, info['blocks']))} max_tokens={info['max_tokens']} "
            f"train_batches={info['train_batches']} sample_batch={info['sample_batch']}; torch {info['torch']}; "
            f"parameters: vanilla {info['params']['vanilla']:,}, BET {info['params']['bet_sf']:,}")
    return head + "\n\n" + "\n".join(lines), medians, ratios, met


def write_outputs(out_dir, size, text, payload):
    os.makedirs(out_dir, exist_ok=True)
    with atomic_write(os.path.join(out_dir, f"speed_{size}.json")) as f:
        json.dump(payload, f, indent=2)
    with atomic_write(os.path.join(out_dir, f"speed_{size}.md")) as f:
        f.write(text + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", choices=sorted(SIZES) + sorted(LM_SIZES), default="iwslt")
    p.add_argument("--reps", type=int, default=None, help="repetitions (medians are reported; default 5, "
                   "--quick 1)")
    p.add_argument("--quick", action="store_true", help="one repetition; language models: block 128 (or the "
                   "first of --block), one batch of 1024 tokens, 8 new tokens")
    p.add_argument("--block", default=None, help="language models: comma-separated block lengths (default 512)")
    p.add_argument("--train-batches", type=int, default=None, help="language models: batches per repetition (2)")
    p.add_argument("--prompt", type=int, default=64, help="language models: prompt tokens before sampling")
    p.add_argument("--new-tokens", type=int, default=None, help="language models: sampled tokens (64)")
    p.add_argument("--sample-batch", type=int, default=8, help="language models: sequences sampled at once")
    p.add_argument("--out", help="write speed_SIZE.json and speed_SIZE.md into this folder")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    p.add_argument("--data", help="fairseq-preprocess output folder (default: synthetic IWSLT-like batches)")
    p.add_argument("--subset", default="train", help="split of --data to take batches from")
    p.add_argument("--source-lang", default="de")
    p.add_argument("--target-lang", default="en")
    p.add_argument("--max-tokens", type=int, help="tokens per training batch (default per --size; language "
                   "models 2048)")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--gen-sentences", type=int, default=200, help="translation: source sentences generated as "
                   "fairseq-generate batches them (--gen-batch-size), every hypothesis --forced-len tokens (0: skip)")
    p.add_argument("--gen-batch-size", type=int, default=50, help="translation: fairseq-generate's --batch-size")
    p.add_argument("--gen-subset", default="valid", help="split of --data for --gen-sentences")
    p.add_argument("--forced-len", type=int, default=30, help="tokens of every hypothesis (min_len = max_len)")
    p.add_argument("--latency-sentences", type=int, default=8, help="translation: sentences generated one at a "
                   "time (batch 1), ms per token (0: skip)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall: elapsed time, as fairseq reports it; cpu: this process's CPU time "
                   "(all its threads), steadier when other jobs share the machine")
    p.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    p.add_argument("--generation-only", action="store_true", help="generation (language models: eval-lm and "
                   "sampling) only: no training, no memory")
    p.add_argument("--json", help="also write all figures to this JSON file")
    p.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.reps is not None and args.reps < 1:  # checked before the default below, which would take 0 for "unset"
        p.error("--reps must be >= 1")
    args.reps = args.reps or (1 if args.quick else 5)
    if args.size in LM_SIZES:
        args.blocks = [int(b) for b in (args.block or ("128" if args.quick else "512")).split(",")][:1 if args.quick
                                                                                                     else None]
        args.max_tokens = args.max_tokens or (1024 if args.quick else 2048)
        args.train_batches = args.train_batches or (1 if args.quick else 2)
        args.new_tokens = args.new_tokens or (8 if args.quick else 64)
    if args.reps < 1:
        p.error("--reps must be >= 1")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device is available")
    if args.clock == "cpu" and args.device.startswith("cuda"):
        p.error("--clock cpu measures CPU time; use --clock wall with --device cuda")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_child:
        return lm_memory_child(args) if args.size in LM_SIZES else memory_child(args)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.size in LM_SIZES:
        info, results = run_lm(args)
        text, medians, ratios, met = lm_table(info, results)
        print(text)
        payload = dict(info=info, results=results, medians=medians, median_ratios=ratios, targets=LM_TARGETS,
                       met=met)
        if args.json:
            with atomic_write(args.json) as f:
                json.dump(payload, f, indent=2)
        if args.out:
            write_outputs(args.out, args.size, text, payload)
        return
    info, results = run(args)
    text, med, verdict = table(info, results)
    print(text)
    ratios = {k: med[BET][k] / med[VANILLA][k] for k in med[VANILLA]}
    payload = dict(info=info, results=results, medians=med, median_ratios=ratios, targets=TARGETS, met=verdict)
    if args.json:
        with atomic_write(args.json) as f:
            json.dump(payload, f, indent=2)
    if args.out:
        write_outputs(args.out, args.size, text, payload)


if __name__ == "__main__":
    main()
