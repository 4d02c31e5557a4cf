"""The study in one table: which systems (a row of the catalog and a setting), on which datasets, with how many
seeds, in which part, at which scale.

A run is one (dataset, row, seed, setting). Its fairseq-train flags are the dataset's recipe
(``bet_fairseq/recipes.py`` over its catalog entry: IWSLT14's for Multi30k, WikiText-2's for WikiText-2), then
the scale's overrides for its kind (model size, updates, schedule), then the row's own flags
(``bet_fairseq/catalog.py``: BET(SG)'s task and pointer loss), then the setting's (a sweep point, a control:
``SETTINGS``), then the seed. The study's datasets are the catalog's with ``study=True``. Pure Python: imports
neither fairseq nor torch.

The seconds per run are estimates from the per-update CPU time of fairseq-train with one thread (wall time on a
shared machine is no measure; docs/reproduce.md says how and under what load), used to print the expected time
of each part before it starts and the time left while it runs.
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from bet_fairseq import catalog, recipes
from bet_fairseq.errors import InputError
from bet_fairseq.recipes import ADAPTIVE_LM as _ADAPTIVE_LM, STUDY_LM, Flags, lm_sizes, merge, mt_sizes

SCALES = ("smoke", "cpu", "paper")

# the study's datasets, the headline's first (the report's order)
DATASETS: Dict[str, catalog.Dataset] = {k: catalog.DATASETS[k] for k in
                                        sorted((k for k, d in catalog.DATASETS.items() if d.study),
                                               key=lambda k: catalog.DATASETS[k].kind != "mt")}

BASELINE = "vanilla"
ANALYSED = ("vanilla", "bet_sf")  # Table 1 and the heatmap, on their first seed's checkpoint
HEADLINE = "bet_sf"  # the contrast the study exists for: BET(SF) against the Transformer, paired by seed


# ----------------------------------------------------------------------------- settings beyond a row's flags
# A setting is a named set of extra fairseq-train flags on top of a row (a point of a sweep, a control). The
# empty name is the row as the catalog has it.

def _number(value) -> str:
    return f"{value:g}"


def pointer_setting(pointer_lambda: float, heads: str) -> str:
    """The setting name of a BET(SG) pointer-loss point, the default's included: a point keeps its name whatever
    the default (the row's runs at the default have the same commands, and are copied from it: ``twins``)."""
    return f"lambda{_number(pointer_lambda)}-{heads}"


POINTER_LAMBDAS = (0.002, 0.01, 0.05)
POINTER_HEADS = ("mean", "first")
DIAG_SCALES = (0.0, 0.2, 0.5, 1.0, 2.0)  # Figure 3; 1.0 is the Transformer itself (its runs are the point)

SETTINGS: Dict[str, Flags] = {
    # The language-model control: the Transformer trained on sentences as BET(SG)'s task trains (one line per
    # sample), evaluated on 512-token blocks like every row: BET(SG) minus it compares like with like.
    "sentences": {"--sample-break-mode": "eos", "--skip-invalid-size-inputs-valid-test": True},
    **{pointer_setting(lam, heads): {"--pointer-lambda": lam, "--pointer-heads": heads}
       for lam in POINTER_LAMBDAS for heads in POINTER_HEADS},
    **{f"x{_number(c)}": {"--diag-scale": c} for c in DIAG_SCALES if c != 1.0},
}
# system -> the system it is also compared with, like for like (BET(SG)'s language model trains on sentences
# as the control does; both are evaluated on 512-token blocks)
CONTROLS = {"bet_sg": "vanilla+sentences"}
# how a setting changes its row's label ({row}: the row's own label)
SETTING_LABELS = {"sentences": "{row} trained on sentences (control)",
                  **{f"x{_number(c)}": f"Transformer (diagonal x {_number(c)})" for c in DIAG_SCALES},
                  **{pointer_setting(lam, heads): f"{{row}} (lambda_p {_number(lam)}, {heads})"
                     for lam in POINTER_LAMBDAS for heads in POINTER_HEADS}}


def diag_point(scale: float) -> Tuple[str, str]:
    """(row, setting) of Figure 3's point at diagonal scale ``scale``."""
    return (BASELINE, "") if scale == 1.0 else ("diag_scale", f"x{_number(scale)}")


def pointer_point(pointer_lambda: float, heads: str) -> Tuple[str, str]:
    return "bet_sg", pointer_setting(pointer_lambda, heads)


# ----------------------------------------------------------------------------- THE TABLE: parts and arms
# An arm is one system (dataset, row, setting) trained with seeds 1..N; N comes from its role at each scale
# (SEEDS). A part is a list of arms that fits about 3-4 hours on 2 cores at the cpu scale (--jobs 2); parts run
# separately (--part), in any order, and share finished runs (an arm in two parts is trained once).


@dataclass(frozen=True)
class Arm:
    dataset: str
    row: str
    setting: str = ""
    role: str = "row"
    seeds_from: int = 1  # a part may take only some of the role's seeds: seeds_from..seeds_to
    seeds_to: Optional[int] = None


SEEDS: Dict[str, Dict[str, int]] = {
    # headline: BET(SF) and the Transformer on Multi30k (a paired-difference SD of 0.3-0.5 BLEU needs ~8 seeds to
    # resolve +-0.4); row: the other rows; point: Figure 3's points; sweep: the points of BET(SG)'s lambda_p sweep,
    # which only choose a setting on validation nll; decomposition: the 2 x 2 of DiagFreeMask and the re-weighting
    # by R (Transformer, + DiagFreeMask, BET(SF) - DiagFreeMask, BET(SF)), paired with the headline's seeds
    "smoke": {"headline": 2, "row": 2, "point": 1, "sweep": 1, "decomposition": 2},
    "cpu": {"headline": 8, "row": 3, "point": 3, "sweep": 2, "decomposition": 8},
    "paper": {"headline": 8, "row": 3, "point": 3, "sweep": 2, "decomposition": 8},
}

# The 2 x 2 decomposition of BET(SF) into its two changes: {(mask, re-weighting): row}. Its two contrasts, paired by
# seed: what the re-weighting adds to the mask (BET(SF) against + DiagFreeMask) and the re-weighting alone
# (BET(SF) - DiagFreeMask against the Transformer).
DECOMPOSITION = {(False, False): BASELINE, (True, False): "diagfree", (False, True): "bet_sf_nodiagmask",
                 (True, True): "bet_sf"}
DECOMPOSITION_CONTRASTS = (("bet_sf", "diagfree"), ("bet_sf_nodiagmask", BASELINE))

PARTS: Dict[str, List[Arm]] = {
    # the headline pair in three parts of up to ~2.7 hours at the cpu scale: seeds 1-3, 4-6, 7-8
    "headline": [Arm("multi30k", r, role="headline", seeds_to=3) for r in (BASELINE, HEADLINE)],
    "headline2": [Arm("multi30k", r, role="headline", seeds_from=4, seeds_to=6) for r in (BASELINE, HEADLINE)],
    "headline3": [Arm("multi30k", r, role="headline", seeds_from=7) for r in (BASELINE, HEADLINE)],
    # BET(SG)'s lambda_p x --pointer-heads sweep (chosen on validation nll); the row's seeds that the default's point
    # has are copies of its runs (twins)
    "pointer": [Arm("multi30k", *pointer_point(lam, "mean"), role="sweep") for lam in POINTER_LAMBDAS],
    "pointer2": [Arm("multi30k", *pointer_point(lam, "first"), role="sweep") for lam in POINTER_LAMBDAS],
    "rows": [Arm("multi30k", "diagfree"), Arm("multi30k", "bet_sg")],
    # Figure 3, in two parts
    "diag": [Arm("multi30k", *diag_point(c), role="point") for c in DIAG_SCALES if c < 0.5],
    "diag2": [Arm("multi30k", *diag_point(c), role="point") for c in DIAG_SCALES if c >= 0.5 and c != 1.0],
    "lm": [Arm("wikitext2", r) for r in (BASELINE, "diagfree", "bet_sf", "bet_sg")]
          + [Arm("wikitext2", BASELINE, "sentences")],
    # the decomposition (DECOMPOSITION), every cell at the role's seeds, in parts of ~2-4 hours; the cells' runs
    # that the parts above already hold (the headline pair, seeds 1-3 of the rows) are not trained again
    "decomp_lm": [Arm("wikitext2", r, role="decomposition", seeds_to=5) for r in DECOMPOSITION.values()],
    "decomp_lm2": [Arm("wikitext2", r, role="decomposition", seeds_from=6) for r in DECOMPOSITION.values()],
    "decomp": [Arm("multi30k", r, role="decomposition", seeds_to=4) for r in DECOMPOSITION.values()],
    "decomp2": [Arm("multi30k", r, role="decomposition", seeds_from=5) for r in DECOMPOSITION.values()],
}
MAIN_ROWS = (BASELINE, "diagfree", "bet_sf", "bet_sg")  # the report's order: these, then the others
# a study dataset of the catalog that no part names gets a part of its own: the main rows it covers
PARTS.update({key: [Arm(key, r) for r in MAIN_ROWS if ds.kind in catalog.row(r).kinds]
              for key, ds in DATASETS.items() if not any(a.dataset == key for arms in PARTS.values() for a in arms)})
ALL_ROWS = list(MAIN_ROWS) + [k for k in catalog.ROWS if k not in MAIN_ROWS]


def arm_seeds(arm: Arm, scale: str) -> range:
    """The seeds of ``arm`` at ``scale``: its role's 1..N, cut to the arm's own range."""
    top = SEEDS[scale][arm.role]
    return range(arm.seeds_from, min(top, arm.seeds_to or top) + 1)




# The plateau criterion: a run is past its steepest learning when the last ``share`` of its updates lower its
# validation token loss (nll, bits) by less than ``max_drop`` of its final value (stats.plateau). Every run of the
# cpu scale is meant to meet it; the report prints it per run.
PLATEAU = {"share": 0.2, "max_drop": 0.02}
PLATEAU_TEXT = (f"the last {PLATEAU['share']:.0%} of the updates lower the validation token loss (nll) by less than "
                f"{PLATEAU['max_drop']:.0%} of its final value")


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
    ar_trials: int = 10000  # sacreBLEU's approximate randomisation
    notes: Tuple[str, ...] = field(default_factory=tuple)
    departures: Tuple[str, ...] = field(default_factory=tuple)  # from the paper's settings, for the report


# every row selects checkpoint_best on the token loss (BET(SG)'s training loss includes lambda_p * L_p)
_NLL_BEST: Flags = {"--best-checkpoint-metric": "nll_loss", "--maximize-best-checkpoint-metric": None}

_CPU_COMMON: Flags = {"--cpu": True, "--num-workers": 0, "--log-format": "json", "--no-progress-bar": True,
                      "--max-epoch": None, "--keep-interval-updates": 1,
                      "--no-epoch-checkpoints": True}

SCALE_TABLE: Dict[str, Scale] = {
    "smoke": Scale(
        "smoke", "a test of the machinery: a few hundred sentences, a tiny model, a few updates (not results)",
        data={"mt": {"max_train": 300, "max_eval": 20, "bpe_merges": 300},
              "lm": {"max_train": 300, "max_eval": 30, "bpe_merges": 0}},
        train={"mt": merge(mt_sizes(2, 32, 64, 4), recipes.NO_VALID_BLEU, _CPU_COMMON, _NLL_BEST, {
                   "--max-tokens": 1024, "--lr": 2e-3, "--warmup-updates": 4, "--max-update": 8,
                   "--log-interval": 2, "--validate-interval-updates": 2}),
               "lm": merge(lm_sizes(2, 32, 64, 4), _CPU_COMMON, _ADAPTIVE_LM, {
                   "--adaptive-softmax-cutoff": "500,1500", "--tokens-per-sample": 64, "--batch-size": None, "--max-tokens": 512, "--lr": 2e-3,
                   "--warmup-updates": 4, "--max-update": 8, "--patience": None,
                   "--log-interval": 2, "--validate-interval-updates": 2})},
        eval={"mt": {"--cpu": True, "--batch-size": 64, "--max-len-a": 1.2, "--max-len-b": 10,
                           "--num-workers": 0},
              "lm": {"--cpu": True, "--tokens-per-sample": 64, "--context-window": 32, "--batch-size": 16,
                            "--num-workers": 0}},
        seconds_per_run={"mt": 2.0, "lm": 2.0}, seconds_prepare={"mt": 8.0, "lm": 6.0},
        analysis_batches=4, bootstrap_resamples=200, ar_trials=500,
        departures=("everything: a test of the machinery, not a setting",)),
    "cpu": Scale(
        "cpu", "small models on the full corpora, trained past their steepest learning (the plateau criterion); "
               "parts of 1-4 hours on 2 CPU cores (--jobs 2)",
        data={"mt": {"max_train": 0, "max_eval": 0, "bpe_merges": 4000},
              "lm": {"max_train": 0, "max_eval": 0, "bpe_merges": 0}},
        # MT: 3+3 layers of 128 (IWSLT14's recipe otherwise), 6,000 updates of 2,048 tokens (~22 epochs: at 2,000
        # and 4,000 the last fifth still lowered the validation nll by 3.4-4% and 2.6-3%, docs/reproduce.md);
        # LM: 3 layers of 128 on blocks of 512 (the paper's), adaptive softmax, Adam eps 1e-8, 3,000 updates of
        # 2,048 tokens (~3 epochs: at 2,000 a sentence-trained run's last fifth still lowered its nll by 2.1%).
        # Per-update CPU costs and how they were measured: docs/reproduce.md.
        train={"mt": merge(mt_sizes(3, 128, 512, 4), recipes.NO_VALID_BLEU, _CPU_COMMON, _NLL_BEST, {
                   "--max-tokens": 2048, "--lr": 2e-3, "--warmup-updates": 300, "--dropout": 0.1,
                   "--weight-decay": None, "--max-update": 6000,
                   "--log-interval": 50, "--validate-interval-updates": 200, "--save-interval-updates": 200}),
               "lm": merge(STUDY_LM, _CPU_COMMON, _ADAPTIVE_LM, {
                   "--tokens-per-sample": 512, "--batch-size": None, "--max-tokens": 2048, "--lr": 2e-3,
                   "--warmup-updates": 300, "--dropout": 0.1, "--max-update": 3000, "--patience": None,
                   "--max-valid-steps": 25, "--log-interval": 50, "--validate-interval-updates": 200,
                   "--save-interval-updates": 200})},
        eval={"mt": {"--cpu": True, "--max-len-a": 1.2, "--max-len-b": 10, "--num-workers": 0},
              "lm": {"--cpu": True, "--tokens-per-sample": 512, "--context-window": 256, "--batch-size": 4,
                            "--num-workers": 0}},
        # seconds a run: MT 6,000 x ~0.53 s + 30 validations + beam-5 test (two runs side by side on 2 idle cores);
        # LM: the part's 2,000-update runs took 740-920 s each, two side by side (training, validations, eval-lm;
        # docs/reproduce.md), so ~1,350 s at 3,000
        seconds_per_run={"mt": 3250.0, "lm": 1350.0},
        # measured: Moses + BPE + binarising ~30 s each; bet-syntax-hints (spaCy, one process) 200 s on
        # Multi30k's English side, 130 s on WikiText-2's train and valid lines
        seconds_prepare={"mt": 250.0, "lm": 200.0},
        analysis_batches=50,
        departures=(
            "Multi30k De-En (29k pairs) instead of IWSLT14 De-En: lowercased, Moses, 4,000 joint BPE merges (the "
            "paper's IWSLT14 vocabulary is ~10k).",
            "Translation models: 3+3 layers of 128 (FFN 512, 4 heads) instead of transformer_iwslt_de_en's 6+6 of "
            "512; 6,000 updates of 2,048 tokens (~22 epochs) instead of 50 epochs of 4,096; lr 2e-3 with 300 warmup "
            "updates (inverse square root as the paper's), dropout 0.1 instead of 0.3, no weight decay.",
            "checkpoint_best.pt by validation token loss (nll) for every translation row instead of validation BLEU "
            "(no beam search during training); the test scores are of that checkpoint.",
            "Language models: 3 layers of 128 (FFN 512, 4 heads) instead of 6 of 300; blocks of 512 tokens as the "
            "paper's, 2,048 tokens an update instead of 64 blocks; 3,000 updates (~3 epochs of WikiText-2); lr 2e-3 "
            "with 300 warmup updates; Adam eps 1e-8 instead of the authors' 1e-3; validation on its first 25 batches.",
            "Every WikiText-2 row uses fairseq's adaptive softmax (cutoffs 2,000 and 10,000; adaptive_loss, and "
            "adaptive_loss_with_pointer for BET(SG)) instead of a full 33k-word softmax; test perplexity is exact "
            "(the adaptive softmax's full distribution), with a 256-token context window.",
            "BET(SG) on WikiText-2 trains on sentences (its hints are per line) and is evaluated on 512-token blocks; "
            "the control row 'Transformer trained on sentences' measures what that alone changes.",
            "BET(SG)'s lambda_p and --pointer-heads are not in the paper: chosen by this study's sweep on Multi30k "
            "validation nll (part pointer).",
        )),
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
        departures=("Multi30k instead of IWSLT14 for the translation rows (lowercased, 10,000 joint BPE merges); "
                    "otherwise the paper's recipes (bet_fairseq/recipes.py).",),
        notes=("GPU-hours are estimates, not measurements.",)),
}


@dataclass(frozen=True)
class Run:
    dataset: str
    row: str
    seed: int
    setting: str = ""  # a key of SETTINGS ("": the row as the catalog has it)

    @property
    def system(self) -> str:
        return system_name(self.row, self.setting)

    @property
    def name(self) -> str:
        return f"{self.dataset}/{self.system}/seed{self.seed}"

    @property
    def flags(self) -> Flags:
        return SETTINGS[self.setting] if self.setting else {}


def system_name(row: str, setting: str = "") -> str:
    """The row and its setting, as records and folders name them: ``bet_sg``, ``bet_sg+lambda0.002-first``,
    ``diag_scale+x0.5``."""
    return row + (f"+{setting}" if setting else "")


def system_label(row: str, setting: str = "") -> str:
    label = catalog.row(row).label
    if not setting:
        return label
    return SETTING_LABELS[setting].format(row=label)


def plan(scale: str, rows: Optional[List[str]] = None, datasets: Optional[List[str]] = None,
         max_seeds: Optional[int] = None, parts: Optional[List[str]] = None) -> List[Run]:
    """The runs of ``parts`` (all by default), part by part and within a part seed by seed (every arm's seed 1
    first), so that an interrupted part already holds comparisons paired by seed. ``rows`` / ``datasets`` keep
    only those arms; a row that is in no arm gets one on each dataset it covers (the ``row`` seeds)."""
    if scale not in SCALES:
        raise InputError(f"--scale {scale!r}: one of {', '.join(SCALES)}")
    for d in datasets or ():
        if d not in catalog.DATASETS:
            raise InputError(f"--dataset {d!r}: the study's datasets are {', '.join(DATASETS)} (or any of "
                             f"{', '.join(catalog.DATASETS)})")
    rows = [catalog.ROW_ALIASES.get(r, r) for r in rows] if rows else None
    for r in rows or ():
        if r not in catalog.ROWS:
            raise InputError(f"--only {r!r}: the study's rows are {', '.join(MAIN_ROWS)} (or any of "
                             f"{', '.join(catalog.ROWS)})")
    if max_seeds is not None and max_seeds < 1:
        raise InputError(f"--max-seeds must be >= 1, got {max_seeds}")
    for part in parts or ():
        if part not in PARTS:
            raise InputError(f"--part {part!r}: one of {', '.join(PARTS)}")

    def kept(arm):
        return (rows is None or arm.row in rows) and (datasets is None or arm.dataset in datasets)

    groups = [[a for a in PARTS[part] if kept(a)] for part in parts or PARTS]
    for r in rows or ():
        if not any(a.row == r and (datasets is None or a.dataset in datasets) for arms in PARTS.values() for a in arms):
            if catalog.row(r).needs:
                raise InputError(f"--only {r!r}: the row needs --{catalog.row(r).needs[0].replace('_', '-')}; "
                                 "the study runs it only at the sweep points of its parts")
            groups.append([Arm(d, r) for d in (datasets or DATASETS) if catalog.dataset(d).kind in catalog.row(r).kinds])
    runs: List[Run] = []
    for group in groups:
        top = max([max(arm_seeds(a, scale), default=0) for a in group] + [0])
        if max_seeds is not None:
            top = min(top, max_seeds)
        for seed in range(1, top + 1):
            for arm in group:
                run = Run(arm.dataset, arm.row, seed, arm.setting)
                if seed in arm_seeds(arm, scale) and run not in runs:
                    runs.append(run)
    return runs


def expected_seconds(scale: str, runs: List[Run], jobs: int = 1, prepare: bool = True) -> float:
    sc = SCALE_TABLE[scale]
    total = sum(sc.seconds_per_run[catalog.dataset(r.dataset).kind] for r in runs) / max(1, jobs)
    if prepare:
        total += sum(sc.seconds_prepare[catalog.dataset(d).kind] for d in {r.dataset for r in runs})
    return total
