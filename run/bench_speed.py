#!/usr/bin/env python
"""BET(SF) vs the vanilla transformer, side by side in one process: training and generation speed,
and the peak memory of a training step.

Both benchmarks behind one command: ``--size`` picks translation (``bench_translation.py``: iwslt, small) or the
language models (``bench_lm.py``: lm, lm_wikitext103, lm_enwik8, lm_tiny, lm_study), whose docstrings say what is
measured and how. Takes the options of both; those of the other benchmark are accepted and have no effect.

    python run/bench_speed.py --size iwslt --reps 5            # synthetic IWSLT-shaped batches
    python run/bench_speed.py --size small --data DATA-BIN      # real batches from a data-bin dir
    python run/bench_speed.py --size lm_enwik8 --block 128,512,1024 --reps 5 --out DIR   # language models
    python run/bench_speed.py --size lm_enwik8 --quick --out DIR   # one repetition, block 128, minutes
"""

import argparse

import bench_lm
import bench_translation
import fairseq_bench as fb


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    helps = {key: f"translation: {bench_translation.HELP[key]}; language models: {bench_lm.HELP[key]}"
             for key in ("quick", "max_tokens", "generation_only")}
    fb.add_common_options(p, sorted(bench_translation.SIZES) + sorted(bench_lm.SIZES), "iwslt", helps["quick"],
                          helps["max_tokens"], helps["generation_only"])
    bench_lm.add_own_options(p)
    bench_translation.add_own_options(p)
    return p


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    benchmark = bench_lm if args.size in bench_lm.SIZES else bench_translation
    benchmark.benchmark(p, args)


if __name__ == "__main__":
    main()
