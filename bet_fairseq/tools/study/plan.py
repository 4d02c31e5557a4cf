"""The study in one table: which rows, on which datasets, with how many seeds, at which scale.

A run is one (dataset, row, seed). Its fairseq-train flags are the dataset's recipe (``bet_fairseq/recipes.py``
over its catalog entry: IWSLT14's for Multi30k, WikiText-2's for WikiText-2), then the scale's overrides for
its kind (model size, updates, schedule), then the row's own flags (``bet_fairseq/catalog.py``: BET(SG)'s task
and pointer loss), then the seed. The study's datasets are the catalog's with ``study=True`` (any catalog
dataset with ``--dataset``). Pure Python: imports neither fairseq nor torch.

The seconds per run are measured estimates (process CPU time of fairseq-train with one thread,
which a busy machine does not inflate as it does wall time; see docs/reproduce.md for how), used
to print the expected total before a study starts and the time left while it runs.
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from bet_fairseq import catalog, recipes
from bet_fairseq.recipes import Flags, lm_sizes, merge, mt_sizes

SCALES = ("smoke", "cpu", "paper")

DATASETS: Dict[str, catalog.Dataset] = {k: d for k, d in catalog.DATASETS.items() if d.study}

# ----------------------------------------------------------------------------- THE TABLE
# row (a key of bet_fairseq/catalog.py) -> seeds at each scale (seeds 1..N; paired by seed). At the
# cpu scale 5 seeds of the Transformer and BET(SF) did not fit 3 hours with models past their steepest
# learning; 3 seeds each did.
STUDY: Dict[str, Dict[str, int]] = {
    "vanilla": {"smoke": 2, "cpu": 3, "paper": 5},
    "diagfree": {"smoke": 2, "cpu": 3, "paper": 3},
    "bet_sf": {"smoke": 2, "cpu": 3, "paper": 5},
    "bet_sg": {"smoke": 2, "cpu": 3, "paper": 3},
}
OTHER_ROW_SEEDS = {"smoke": 2, "cpu": 3, "paper": 3}  # any other catalog row, when --only names it
ALL_ROWS = list(STUDY) + [k for k in catalog.ROWS if k not in STUDY]  # the order of the report's rows
BASELINE = "vanilla"
ANALYSED = ("vanilla", "bet_sf")  # Table 1 (CA, HA, Ratio) on their first seed's checkpoint


@dataclass(frozen=True)
class Scale:
    name: str
    description: str
    data: Dict[str, Dict[str, int]]  # kind -> data.prepare sizes (0: all)
    train: Dict[str, Flags]  # kind -> overrides of the dataset's recipe
    eval: Dict[str, Flags]  # kind -> overrides of the evaluation recipe
    seconds_per_run: Dict[str, float]  # kind -> train + evaluation (+ Table 1), measured estimate
    seconds_prepare: Dict[str, float]  # kind -> data preparation with BET(SG) hints
    device: str = "cpu"
    analysis_batches: int = 100  # Table 1: at most this many validation batches
    bootstrap_resamples: int = 1000
    notes: Tuple[str, ...] = field(default_factory=tuple)


_CPU_COMMON: Flags = {"--cpu": True, "--num-workers": 0, "--log-format": "json", "--no-progress-bar": True,
                      "--max-epoch": None, "--keep-interval-updates": 1,
                      "--no-epoch-checkpoints": True}

SCALE_TABLE: Dict[str, Scale] = {
    "smoke": Scale(
        "smoke", "a test of the machinery: a few hundred sentences, a tiny model, a few updates (not results)",
        data={"mt": {"max_train": 300, "max_eval": 20, "bpe_merges": 300},
              "lm": {"max_train": 300, "max_eval": 30, "bpe_merges": 0}},
        train={"mt": merge(mt_sizes(2, 32, 64, 4), recipes.NO_VALID_BLEU, _CPU_COMMON, {
                   "--max-tokens": 1024, "--lr": 2e-3, "--warmup-updates": 4, "--max-update": 6,
                   "--log-interval": 2, "--validate-interval-updates": 3}),
               "lm": merge(lm_sizes(2, 32, 64, 4), _CPU_COMMON, {
                   "--tokens-per-sample": 64, "--batch-size": None, "--max-tokens": 512, "--lr": 2e-3,
                   "--warmup-updates": 4, "--max-update": 6, "--patience": None,
                   "--log-interval": 2, "--validate-interval-updates": 3})},
        eval={"mt": {"--cpu": True, "--batch-size": 64, "--max-len-a": 1.2, "--max-len-b": 10,
                           "--num-workers": 0},
              "lm": {"--cpu": True, "--tokens-per-sample": 64, "--context-window": 32, "--batch-size": 16,
                            "--num-workers": 0}},
        seconds_per_run={"mt": 2.0, "lm": 2.0}, seconds_prepare={"mt": 8.0, "lm": 6.0},
        analysis_batches=4, bootstrap_resamples=1000),
    "cpu": Scale(
        "cpu", "small models on the full corpora, about 3 hours on 2 CPU cores (--jobs 2)",
        data={"mt": {"max_train": 0, "max_eval": 0, "bpe_merges": 4000},
              "lm": {"max_train": 0, "max_eval": 0, "bpe_merges": 0}},
        # 3+3 layers of 128 (MT), 3 layers of 128 (LM, post-norm, blocks of 512 as the paper's); timed on
        # this project's 2-core machine: ~0.7 s (MT, 2048 tokens) and ~1.5 s (LM, 2048 tokens: the 33k-word
        # output layer) of CPU time an update, so ~750 MT updates (~3.5 epochs of Multi30k) and ~300 LM updates
        # (~0.3 epoch of WikiText-2); --max-valid-steps keeps the LM's validation points cheap. Measured wall
        # time a run with --jobs 2 (2026-12-03): Multi30k ~520 s (training ~490, beam-5 test ~25), WikiText-2
        # ~1,200 s (training ~800, eval-lm with a 256-token context window ~400-480): ~2.9 h for the 24 runs.
        train={"mt": merge(mt_sizes(3, 128, 512, 4), recipes.NO_VALID_BLEU, _CPU_COMMON, {
                   "--max-tokens": 2048, "--lr": 2e-3, "--warmup-updates": 300, "--dropout": 0.1,
                   "--weight-decay": None, "--max-update": 750,
                   "--log-interval": 25, "--validate-interval-updates": 150, "--save-interval-updates": 150}),
               "lm": merge(lm_sizes(3, 128, 512, 4), _CPU_COMMON, {
                   "--tokens-per-sample": 512, "--batch-size": None, "--max-tokens": 2048, "--lr": 2e-3,
                   "--warmup-updates": 100, "--dropout": 0.1, "--max-update": 300, "--patience": None,
                   "--max-valid-steps": 25, "--log-interval": 20, "--validate-interval-updates": 75,
                   "--save-interval-updates": 75})},
        eval={"mt": {"--cpu": True, "--max-len-a": 1.2, "--max-len-b": 10, "--num-workers": 0},
              "lm": {"--cpu": True, "--tokens-per-sample": 512, "--context-window": 256, "--batch-size": 4,
                            "--num-workers": 0}},
        seconds_per_run={"mt": 520.0, "lm": 1200.0},
        # measured: Moses + BPE + binarising ~30 s each; bet-syntax-hints (spaCy, one process) 200 s on
        # Multi30k's English side, 1,300 s on WikiText-2's 2M tokens
        seconds_prepare={"mt": 250.0, "lm": 1350.0},
        analysis_batches=50),
    "paper": Scale(
        "paper", "the paper's settings (bet_fairseq/recipes.py: transformer_iwslt_de_en / WikiText-2 sizes and "
                 "schedules) for GPU machines",
        data={"mt": {"max_train": 0, "max_eval": 0, "bpe_merges": 10000},
              "lm": {"max_train": 0, "max_eval": 0, "bpe_merges": 0}},
        train={"mt": {"--log-format": "json", "--no-progress-bar": True, "--save-interval-updates": 1000,
                            "--keep-interval-updates": 1},
               "lm": {"--log-format": "json", "--no-progress-bar": True, "--save-interval-updates": 1000,
                             "--keep-interval-updates": 1}},
        eval={"mt": {}, "lm": {}},
        # Not measured (no GPU was available): IWSLT14 sizes, 50 epochs of ~110 updates of 4096 tokens on
        # Multi30k; WikiText-2, up to 200 epochs of 64 updates of 64 x 512 tokens, patience 10.
        seconds_per_run={"mt": 0.5 * 3600, "lm": 1.5 * 3600},
        seconds_prepare={"mt": 600.0, "lm": 1200.0},
        device="gpu", analysis_batches=10000,
        notes=("GPU-hours are estimates, not measurements.",)),
}


@dataclass(frozen=True)
class Run:
    dataset: str
    row: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.dataset}/{self.row}/seed{self.seed}"


def seed_count(row: str, scale: str) -> int:
    return STUDY.get(row, OTHER_ROW_SEEDS)[scale]


def seeds(row: str, scale: str) -> List[int]:
    return list(range(1, seed_count(row, scale) + 1))


def plan(scale: str, rows: Optional[List[str]] = None, datasets: Optional[List[str]] = None,
         max_seeds: Optional[int] = None) -> List[Run]:
    """The runs of a study, seed by seed (every row's seed 1 first), so that an interrupted study already
    holds comparisons paired by seed."""
    if scale not in SCALES:
        raise ValueError(f"--scale {scale!r}: one of {', '.join(SCALES)}")
    rows = [catalog.ROW_ALIASES.get(r, r) for r in (rows or STUDY)]
    datasets = list(datasets or DATASETS)
    for r in rows:
        if r not in catalog.ROWS:
            raise ValueError(f"--only {r!r}: the study's rows are {', '.join(STUDY)} (or any of "
                             f"{', '.join(catalog.ROWS)})")
    for d in datasets:
        if d not in catalog.DATASETS:
            raise ValueError(f"--dataset {d!r}: the study's datasets are {', '.join(DATASETS)} (or any of "
                             f"{', '.join(catalog.DATASETS)})")
    top = max(seed_count(r, scale) for r in rows)
    if max_seeds is not None:
        if max_seeds < 1:
            raise ValueError(f"--max-seeds must be >= 1, got {max_seeds}")
        top = min(top, max_seeds)
    return [Run(d, r, s) for s in range(1, top + 1) for d in datasets for r in rows if s <= seed_count(r, scale)]


def expected_seconds(scale: str, runs: List[Run], jobs: int = 1, prepare: bool = True) -> float:
    sc = SCALE_TABLE[scale]
    total = sum(sc.seconds_per_run[catalog.dataset(r.dataset).kind] for r in runs) / max(1, jobs)
    if prepare:
        total += sum(sc.seconds_prepare[catalog.dataset(d).kind] for d in {r.dataset for r in runs})
    return total
