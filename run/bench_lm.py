#!/usr/bin/env python
"""BET(SF) vs the vanilla transformer language model, side by side in one process: training, eval-lm and
sampling speed, and the peak memory of a training step.

    python run/bench_lm.py --size lm_enwik8 --block 128,512,1024 --reps 5 --out DIR
    python run/bench_lm.py --size lm_enwik8 --quick --out DIR   # one repetition, block 128, minutes

Sizes (``lm``, ``lm_wikitext103``, ``lm_enwik8``: ``vanilla_{size}`` vs ``bet_sf_{size}``, the Table 2 LM recipe,
``bet_fairseq/recipes.py``; ``lm_tiny``: 2 layers of 32 for tests; ``lm_study``: the model of ``bet-reproduce``'s cpu
scale, 3 layers of 128 with adaptive softmax (``recipes.STUDY_LM``, ``recipes.ADAPTIVE_LM``), on WikiText-2's
vocabulary) are measured per block length (``--block``) on the same random token blocks, both models built through
fairseq's task/model/criterion builders and alternating order every repetition:

(a) training, ``Trainer.train_step``, tokens/s;
(b) eval-lm, the model's forward without gradients plus the log-softmax (what fairseq-eval-lm scores), tokens/s;
(c) sampling, token-by-token decoding with the incremental state (``--sample-batch`` random prompts of ``--prompt``
    tokens fed token by token, untimed, then ``--new-tokens`` timed greedy steps), new tokens/s; and with one
    sequence (batch 1, ms per token);
(d) peak memory of a training step, in a fresh subprocess per model: on CUDA ``torch.cuda.max_memory_allocated``
    minus the memory held before the first step; on CPU the growth of the peak resident set (Linux ``VmHWM``).

All eval-lm, then all sampling repetitions run before the first training step (as fairseq-eval-lm runs).
``--generation-only`` skips training and memory. Prints a Markdown table (medians over the repetitions; ratio =
BET / vanilla) and the speed targets (``TARGETS``); ``--json FILE`` writes every repetition's figures too; ``--out
DIR`` writes ``DIR/speed_{size}.json`` and ``DIR/speed_{size}.md``. Translation's benchmark is
``bench_translation.py``.
"""

import argparse
import os
import sys
import tempfile

import torch

import fairseq_bench as fb
from bet_fairseq import catalog, recipes
from bet_fairseq.tools import timing

# size -> Table 2 dataset (the LM recipe), vocabulary of the synthetic dictionary, extra architecture flags
SIZES = {
    "lm": dict(dataset="wikitext2", vocab=33278, overrides={}),
    "lm_wikitext103": dict(dataset="wikitext103", vocab=267735, overrides={}),
    "lm_enwik8": dict(dataset="enwik8", vocab=205, overrides={}),
    "lm_tiny": dict(dataset="enwik8", vocab=205, overrides=recipes.lm_sizes(2, 32, 64, 4)),
    # bet-reproduce's cpu-scale language model: 3 layers of 128, adaptive softmax (2000,10000), WikiText-2's vocabulary
    "lm_study": dict(dataset="wikitext2", vocab=33278, overrides=recipes.merge(recipes.STUDY_LM, recipes.ADAPTIVE_LM)),
}
TARGETS = {"train": 0.90, "eval_lm": 0.90, "sample": 0.95, "sample_b1": 0.95, "memory": 1.15}
ROWS = ("vanilla", "bet_sf")
MS_PER_TOKEN = {"sample_b1"}  # measured in tokens/s like the others, shown as ms per token

# the help of the options both benchmarks take that says what they mean here
HELP = dict(quick="one repetition, block 128 (or the first of --block), one batch of 1024 tokens, 8 new tokens",
            max_tokens="tokens per training batch (default 2048, --quick 1024)",
            generation_only="eval-lm and sampling only: no training, no memory")


# ---------------------------------------------------------------------------------------------
def lm_arch(row, size):
    """The row's architecture on the size's dataset (``lm_tiny``: enwik8's, shrunk by its overrides)."""
    return catalog.row(row).arch(SIZES[size]["dataset"])


def build_lm(row, data_dir, size, device, block, max_tokens):
    spec = SIZES[size]
    flags = recipes.for_softmax(recipes.merge(recipes.train_recipe(spec["dataset"]), spec["overrides"], {
        "--tokens-per-sample": block, "--batch-size": None, "--max-tokens": max_tokens, "--log-format": "none",
        "--num-workers": 0, "--cpu": device == "cpu", "--max-epoch": None, "--patience": None}))
    _, task, trainer = fb.build_trainer(data_dir, lm_arch(row, size), flags)
    return task, trainer


def lm_data_dir(folder, vocab):
    fb.write_dictionary(os.path.join(folder, "dict.txt"), vocab)
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


def time_eval_lm(model, batches, clock):
    model.eval()
    tokens = 0
    watch = clock.stopwatch()
    with torch.no_grad():
        for sample in batches:
            with watch:
                out = model(**sample["net_input"])
                model.get_normalized_probs(out, log_probs=True).gather(-1, sample["target"].unsqueeze(-1))
            tokens += int(sample["ntokens"])
    model.train()
    return tokens / watch.seconds


def time_sample(model, prompt, new_tokens, clock, first_word):
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
        with clock.stopwatch() as watch:
            for _ in range(new_tokens):
                nxt = out[:, -1, first_word:].argmax(-1, keepdim=True) + first_word
                tokens = torch.cat([tokens, nxt], dim=1)
                out, _ = model.decoder(tokens, incremental_state=state)
    model.train()
    return prompt.size(0) * new_tokens / watch.seconds


# ---------------------------------------------------------------------------------------------
def lm_memory_child(args):
    block = int(args.block)
    with tempfile.TemporaryDirectory(prefix="bet_bench_") as tmp:
        task, trainer = build_lm(args.memory_child, lm_data_dir(tmp, SIZES[args.size]["vocab"]), args.size,
                                 args.device, block, args.max_tokens)
        batches = lm_batches(task, block, args.max_tokens, args.train_batches)
        trainer.train_step([batches[0]])  # optimizer state, as in the timed runs
        result = fb.training_step_memory(trainer, batches, args.device)
    fb.print_memory(result)


def measure_lm_memory(args, row, block):
    cmd = [sys.executable, os.path.abspath(__file__), "--memory-child", row, "--size", args.size, "--device",
           args.device, "--block", str(block), "--max-tokens", str(args.max_tokens), "--train-batches",
           str(args.train_batches)]
    return fb.run_memory_child(cmd, args.threads, row)


def run_lm(args, clock):
    results = {}
    with tempfile.TemporaryDirectory(prefix="bet_bench_") as tmp:
        data_dir = lm_data_dir(tmp, SIZES[args.size]["vocab"])
        for block in args.blocks:
            models = {row: build_lm(row, data_dir, args.size, args.device, block, args.max_tokens) for row in ROWS}
            task = models["vanilla"][0]
            batches = lm_batches(task, block, args.max_tokens, args.train_batches)
            eval_batches = lm_batches(task, block, args.max_tokens, args.train_batches, seed=2)
            prompt = lm_prompts(task, args.sample_batch, min(args.prompt, block))
            first_word = task.target_dictionary.nspecial
            res = {row: dict(train=[], eval_lm=[], sample=[], sample_b1=[]) for row in ROWS}

            def report(what):
                return lambda rep, figures: fb.progress(f"block {block} {what}", rep, args.reps, figures)

            # eval-lm and sampling first, in a process that has not trained yet (as fairseq-eval-lm runs), like
            # generation for translation
            for _, trainer in models.values():  # warm-up
                time_eval_lm(trainer.get_model(), eval_batches[:1], clock)
                time_sample(trainer.get_model(), prompt, 2, clock, first_word)
            measures = (("eval_lm", lambda m: time_eval_lm(m, eval_batches, clock)),
                        ("sample", lambda m: time_sample(m, prompt, args.new_tokens, clock, first_word)),
                        ("sample_b1", lambda m: time_sample(m, prompt[:1], args.new_tokens, clock, first_word)))
            for key, measure in measures:
                series = timing.repeat(ROWS, args.reps, lambda row: measure(models[row][1].get_model()),
                                       report=report(key))
                for row, values in series.items():
                    res[row][key] = values
            if not args.generation_only:
                for _, trainer in models.values():  # warm-up: optimizer state
                    trainer.train_step([batches[0]])
                series = timing.repeat(ROWS, args.reps, lambda row: fb.time_train(models[row][1], batches, clock),
                                       report=report("train"))
                for row, values in series.items():
                    res[row]["train"] = values
            params = {row: fb.parameters(t) for row, (_, t) in models.items()}
            del models
            if not (args.no_memory or args.generation_only):
                for row in ROWS:
                    res[row]["memory"] = measure_lm_memory(args, row, block)
            results[str(block)] = res
    info = dict(size=args.size, archs=[lm_arch(r, args.size) for r in ROWS], device=args.device, clock=args.clock,
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
        med = {row: timing.medians({k: v for k, v in r.items() if k != "memory"}) for row, r in res.items()}
        medians[block], ratios[block], met[block] = med, {}, {}
        measured = [key for key in labels if key in med["vanilla"]]
        for key in measured:
            label = labels[key]
            ratio = med["bet_sf"][key] / med["vanilla"][key]
            ratios[block][key], met[block][key] = ratio, ratio >= TARGETS[key]
            ms = key in MS_PER_TOKEN
            lines.append(f"| {block} | {label} | {fb.shown(med['vanilla'][key], ms)} | "
                         f"{fb.shown(med['bet_sf'][key], ms)} | {ratio:.3f} | "
                         f">= {TARGETS[key]} | {'yes' if met[block][key] else 'NO'} |")
        if "memory" in res["vanilla"]:
            mv, mb = res["vanilla"]["memory"], res["bet_sf"]["memory"]
            ratio = mb["step_mb"] / mv["step_mb"]
            ratios[block]["memory"], met[block]["memory"] = ratio, ratio <= TARGETS["memory"]
            lines.append(f"| {block} | training-step memory, MiB ({mv['mode']} growth) | {mv['step_mb']:.0f} | "
                         f"{mb['step_mb']:.0f} | {ratio:.3f} | <= {TARGETS['memory']} | "
                         f"{'yes' if met[block]['memory'] else 'NO'} |")
        lines.append(f"block {block}: " + fb.paired_line(res["vanilla"], res["bet_sf"], measured))
        lines.extend(f"block {block}: {line}" for line in fb.per_run_lines(res, measured, MS_PER_TOKEN))
    head = (f"size={info['size']} device={info['device']} clock={info['clock']} threads={info['threads']} "
            f"reps={info['reps']} blocks={','.join(map(str, info['blocks']))} max_tokens={info['max_tokens']} "
            f"train_batches={info['train_batches']} sample_batch={info['sample_batch']}; torch {info['torch']}; "
            f"parameters: vanilla {info['params']['vanilla']:,}, BET {info['params']['bet_sf']:,}")
    return head + "\n\n" + "\n".join(lines), medians, ratios, met


# ---------------------------------------------------------------------------------------------
def add_own_options(p):
    """The options only this benchmark takes."""
    p.add_argument("--block", default=None, help="language models: comma-separated block lengths (default 512)")
    p.add_argument("--train-batches", type=int, default=None, help="language models: batches per repetition (2)")
    p.add_argument("--prompt", type=int, default=64, help="language models: prompt tokens before sampling")
    p.add_argument("--new-tokens", type=int, default=None, help="language models: sampled tokens (64)")
    p.add_argument("--sample-batch", type=int, default=8, help="language models: sequences sampled at once")


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    fb.add_common_options(p, sorted(SIZES), "lm_enwik8", HELP["quick"], HELP["max_tokens"], HELP["generation_only"])
    add_own_options(p)
    return p


def benchmark(p, args):
    """Run what ``args`` (parsed by ``p``, this benchmark's parser or ``bench_speed.py``'s) ask for."""
    args.blocks = [int(b) for b in (args.block or ("128" if args.quick else "512")).split(",")][:1 if args.quick
                                                                                                 else None]
    args.max_tokens = args.max_tokens or (1024 if args.quick else 2048)
    args.train_batches = args.train_batches or (1 if args.quick else 2)
    args.new_tokens = args.new_tokens or (8 if args.quick else 64)
    clock = fb.check_common(p, args)
    if args.memory_child:
        return lm_memory_child(args)
    info, results = run_lm(args, clock)
    text, medians, ratios, met = lm_table(info, results)
    print(text)
    fb.write_outputs(args, text, dict(info=info, results=results, medians=medians, median_ratios=ratios,
                                      targets=TARGETS, met=met))


def main(argv=None):
    p = parser()
    benchmark(p, p.parse_args(argv))


if __name__ == "__main__":
    main()
