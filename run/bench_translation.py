#!/usr/bin/env python
"""BET(SF) vs the vanilla transformer for translation, side by side in one process: training and generation
speed, and the peak memory of a training step.

    python run/bench_translation.py --size iwslt --reps 5            # synthetic IWSLT-shaped batches
    python run/bench_translation.py --size small --data DATA-BIN      # real batches from a data-bin dir

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
(b') generation as fairseq-generate runs it: ``--gen-sentences`` (200) source sentences in the batches
    fairseq-generate builds with ``--batch-size`` (``--gen-batch-size`` 50: its iterator, length-sorted, sizes a
    multiple of 8), every hypothesis forced to ``--forced-len`` (30) tokens, beam 5, tokens/s; and one sentence at a
    time (batch 1, ``--latency-sentences``: interactive latency, ms per token). ``--generation-only`` skips
    training and memory;
(c) peak memory of a training step, in a fresh subprocess per model (``--memory-mode``):
    on CUDA ``torch.cuda.max_memory_allocated`` minus the memory held before the first step; on
    CPU the peak resident set during the training steps (Linux ``VmHWM``, reset just before them
    through ``/proc/self/clear_refs``) minus the resident set before them: activations, gradients
    and optimizer state beyond the weights (``ru_maxrss`` where /proc is missing).

Prints a Markdown table (medians over the repetitions; ratio = BET / vanilla) and the speed targets (``TARGETS``);
``--json FILE`` writes every repetition's figures too; ``--out DIR`` writes ``DIR/speed_{size}.json`` and
``DIR/speed_{size}.md``. The language models' benchmark is ``bench_lm.py``.
"""

import argparse
import contextlib
import os
import random
import sys
import tempfile

import torch

import fairseq_bench as fb
from bet_fairseq import recipes
from bet_fairseq.tools import timing

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
MEASURES = ("train", "generate", "generate_forced", "latency")
MS_PER_TOKEN = {"latency"}  # measured in tokens/s like the others, shown as ms per token

# the help of the options both benchmarks take that says what they mean here
HELP = dict(quick="one repetition", max_tokens="tokens per training batch (default per --size)",
            generation_only="generation only: no training, no memory")


# ---------------------------------------------------------------------------------------------
def synthetic_data_dir(folder, vocab):
    """A data-bin folder holding only dictionaries (the task needs them; batches are made here)."""
    for lang in ("de", "en"):
        fb.write_dictionary(os.path.join(folder, f"dict.{lang}.txt"), vocab)
    return folder


def build(arch, data_dir, size, device, src="de", tgt="en", max_tokens=None):
    flags = recipes.merge(recipes.BENCH_TRAIN, SIZES[size]["overrides"], {
        "--source-lang": src, "--target-lang": tgt, "--max-tokens": max_tokens or SIZES[size]["max_tokens"],
        "--cpu": device == "cpu"})
    return fb.build_trainer(data_dir, arch, flags)


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


def make_batches(task, data_dir_given, subset, n_batches, max_tokens, seed=1):
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


def generation_batches(batches, n_sentences, n_batches):
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


def time_generate(task, model, gen_batches, beam, device, clock, length=None):
    """Generated tokens of the best hypotheses per second (fairseq-generate's tokens/s), every hypothesis forced to
    ``length`` tokens (default: 1.1 x the batch's mean source length)."""
    from fairseq import utils
    from fairseq.dataclass.configs import GenerationConfig

    model.eval()
    tokens = 0
    forced = length
    watch = clock.stopwatch()
    for sample in gen_batches:
        length = forced or max(2, int(1.1 * float(sample["net_input"]["src_lengths"].float().mean())))
        gen_cfg = GenerationConfig(beam=beam, max_len_a=0, max_len_b=length, min_len=length)
        generator = task.build_generator([model], gen_cfg)
        if device.startswith("cuda"):
            sample = utils.move_to_cuda(sample)
        with watch:
            hypos = task.inference_step(generator, [model], sample)
        tokens += sum(len(h[0]["tokens"]) for h in hypos)  # as fairseq-generate counts
    model.train()
    return tokens / watch.seconds


# ---------------------------------------------------------------------------------------------
def resolve_data(args):
    if args.data:
        if not os.path.isfile(os.path.join(args.data, f"dict.{args.source_lang}.txt")):
            sys.exit(f"--data {args.data}: no dict.{args.source_lang}.txt there (a fairseq-preprocess output folder?)")
        return args.data, contextlib.nullcontext()
    tmp = tempfile.TemporaryDirectory(prefix="bet_bench_")
    return synthetic_data_dir(tmp.name, SIZES[args.size]["vocab"]), tmp


def memory_child(args):
    """Fresh process, one model: peak memory of training steps beyond what was held before."""
    data_dir, cleanup = resolve_data(args)
    with cleanup:
        cfg, task, trainer = build(args.memory_child, data_dir, args.size, args.device,
                                   max_tokens=args.max_tokens)
        batches = make_batches(task, bool(args.data), args.subset, SIZES[args.size]["train_batches"],
                               args.max_tokens or SIZES[args.size]["max_tokens"])
        result = fb.training_step_memory(trainer, batches, args.device)
    fb.print_memory(result)


def measure_memory(args, arch):
    cmd = [sys.executable, os.path.abspath(__file__), "--memory-child", arch, "--size", args.size,
           "--device", args.device, "--subset", args.subset]
    if args.data:
        cmd += ["--data", args.data]
    if args.max_tokens:
        cmd += ["--max-tokens", str(args.max_tokens)]
    return fb.run_memory_child(cmd, args.threads, arch)


def run(args, clock):
    data_dir, cleanup = resolve_data(args)
    archs = (VANILLA, BET)
    with cleanup:
        models = {}
        for arch in archs:
            cfg, task, trainer = build(arch, data_dir, args.size, args.device, args.source_lang,
                                       args.target_lang, args.max_tokens)
            models[arch] = (task, trainer)
        task = models[VANILLA][0]
        spec = SIZES[args.size]
        batches = make_batches(task, bool(args.data), args.subset, spec["train_batches"],
                               args.max_tokens or spec["max_tokens"])
        gen_batches = generation_batches(batches, spec["gen_sentences"], spec["gen_batches"])
        results = {arch: dict(train=[], generate=[], generate_forced=[], latency=[]) for arch in models}

        def generate(measured, length=None):
            return lambda arch: time_generate(models[arch][0], models[arch][1].get_model(), measured, args.beam,
                                              args.device, clock, length)

        def report(what):
            return lambda rep, figures: fb.progress(what, rep, args.reps, figures)

        # Generation first, in a process that has not trained yet, as fairseq-generate runs; measured against
        # the interleaved order (CHANGELOG.md, 0.2.0), inside the noise.
        for arch in archs:  # warm-up
            generate(gen_batches[:1])(arch)
        for arch, values in timing.repeat(archs, args.reps, generate(gen_batches),
                                          report=report("generation")).items():
            results[arch]["generate"] = values
        # as fairseq-generate runs it (--batch-size 50, every hypothesis forced to --forced-len tokens),
        # and one sentence at a time (interactive latency)
        forced_batches = {key: fairseq_generate_batches(task, bool(args.data), args.gen_subset, sentences, size)
                          for key, sentences, size in (("generate_forced", args.gen_sentences, args.gen_batch_size),
                                                       ("latency", args.latency_sentences, 1)) if sentences}
        for key, measured in forced_batches.items():
            for arch, values in timing.repeat(archs, args.reps, generate(measured, args.forced_len),
                                              report=report(key)).items():
                results[arch][key] = values
        if not args.generation_only:
            for _, trainer in models.values():  # warm-up: optimizer state
                trainer.train_step([batches[0]])
            for arch, values in timing.repeat(archs, args.reps,
                                              lambda arch: fb.time_train(models[arch][1], batches, clock),
                                              report=report("training")).items():
                results[arch]["train"] = values
        info = dict(
            size=args.size, device=args.device, clock=args.clock, threads=torch.get_num_threads(), reps=args.reps,
            train_batches=len(batches), train_target_tokens=sum(int(b["ntokens"]) for b in batches),
            gen_sentences=sum(len(b["id"]) for b in gen_batches), beam=args.beam, forced_len=args.forced_len,
            forced_batches={k: [len(b["id"]) for b in v] for k, v in forced_batches.items()},
            data=args.data or "synthetic", torch=torch.__version__,
            params={a: fb.parameters(t) for a, (_, t) in models.items()},
        )
    del models
    if not (args.no_memory or args.generation_only):
        for arch in archs:
            results[arch]["memory"] = measure_memory(args, arch)
    return info, results


def table(info, results):
    med = {a: timing.medians({k: v for k, v in r.items() if k in MEASURES}) for a, r in results.items()}
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
        ms = key in MS_PER_TOKEN
        rows.append(f"| {labels[key]} | {fb.shown(med[VANILLA][key], ms)} | {fb.shown(med[BET][key], ms)} | "
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
    rows.append(fb.paired_line(results[VANILLA], results[BET], keys))
    rows.extend(fb.per_run_lines(results, keys, MS_PER_TOKEN))
    head = (f"size={info['size']} device={info['device']} clock={info['clock']} threads={info['threads']} reps={info['reps']} "
            f"data={info['data']} train: {info['train_batches']} batches, {info['train_target_tokens']} target tokens; "
            f"generate: {info['gen_sentences']} sentences, beam {info['beam']}; torch {info['torch']}; "
            f"parameters: vanilla {info['params'][VANILLA]:,}, BET {info['params'][BET]:,}")
    return head + "\n\n" + "\n".join(rows), med, verdict


# ---------------------------------------------------------------------------------------------
def add_own_options(p):
    """The options only this benchmark takes."""
    p.add_argument("--data", help="fairseq-preprocess output folder (default: synthetic IWSLT-like batches)")
    p.add_argument("--subset", default="train", help="split of --data to take batches from")
    p.add_argument("--source-lang", default="de")
    p.add_argument("--target-lang", default="en")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--gen-sentences", type=int, default=200, help="translation: source sentences generated as "
                   "fairseq-generate batches them (--gen-batch-size), every hypothesis --forced-len tokens (0: skip)")
    p.add_argument("--gen-batch-size", type=int, default=50, help="translation: fairseq-generate's --batch-size")
    p.add_argument("--gen-subset", default="valid", help="split of --data for --gen-sentences")
    p.add_argument("--forced-len", type=int, default=30, help="tokens of every hypothesis (min_len = max_len)")
    p.add_argument("--latency-sentences", type=int, default=8, help="translation: sentences generated one at a "
                   "time (batch 1), ms per token (0: skip)")


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    fb.add_common_options(p, sorted(SIZES), "iwslt", HELP["quick"], HELP["max_tokens"], HELP["generation_only"])
    add_own_options(p)
    return p


def benchmark(p, args):
    """Run what ``args`` (parsed by ``p``, this benchmark's parser or ``bench_speed.py``'s) ask for."""
    clock = fb.check_common(p, args)
    if args.memory_child:
        return memory_child(args)
    info, results = run(args, clock)
    text, med, verdict = table(info, results)
    print(text)
    ratios = {k: med[BET][k] / med[VANILLA][k] for k in med[VANILLA]}
    fb.write_outputs(args, text, dict(info=info, results=results, medians=med, median_ratios=ratios,
                                      targets=TARGETS, met=verdict))


def main(argv=None):
    p = parser()
    benchmark(p, p.parse_args(argv))


if __name__ == "__main__":
    main()
