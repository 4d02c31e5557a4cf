"""The rows of BET_SPEC Table 2, per dataset: which architecture, task, criterion and extra flags each
run uses, and the paper's number. The training / evaluation settings of each dataset are in
``bet_fairseq/recipes.py``.

Extending the table: append a ``Row(...)`` to ``ROWS`` (its ``key`` is what ``bet-run-row --row`` and
``run/<dataset>.sh ROW ...`` take; ``archs`` maps each dataset it covers to an ``--arch`` name, e.g. with
``named("mybaseline")`` for the ``{name}_iwslt`` / ``{name}_lm_enwik8`` naming convention). Options a
row needs beyond the dataset's settings go in ``train_flags`` / ``eval_flags`` (per kind ``"mt"`` /
``"lm"``); a value of ``None`` removes a dataset flag (e.g. a task without ``--sample-break-mode``). A
row whose architecture is not registered when it is run stops with a clear "not available" message.
"""

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from bet_fairseq.recipes import LM_DATASETS, MT_DATASETS

# ----------------------------------------------------------------------------- datasets


@dataclass(frozen=True)
class Dataset:
    key: str
    column: str  # Table 2 column header
    kind: str  # "mt" or "lm"
    metric: str  # "bleu", "ppl" or "bpc"
    prepare: str  # the command that makes its binarised folder
    source: Optional[str] = None
    target: Optional[str] = None


DATASETS: Dict[str, Dataset] = {
    d.key: d
    for d in (
        Dataset("iwslt14_de_en", "De-En", "mt", "bleu", "bet-prepare-iwslt14 --raw-dir RAW --out-dir DATA/iwslt14 "
                "(binarised: DATA/iwslt14/bin)", "de", "en"),
        Dataset("wmt17_en_de", "En-De", "mt", "bleu", "bet-prepare-wmt17 --raw-dir RAW --out-dir DATA/wmt17 "
                "(binarised: DATA/wmt17/bin)", "en", "de"),
        Dataset("wikitext2", "WikiText-2", "lm", "ppl", "bet-prepare-wikitext --dataset wikitext-2 --raw-dir RAW "
                "--out-dir DATA/wikitext2 (binarised: DATA/wikitext2/bin)"),
        Dataset("wikitext103", "WikiText-103", "lm", "ppl", "bet-prepare-wikitext --dataset wikitext-103 --raw-dir RAW "
                "--out-dir DATA/wikitext103 (binarised: DATA/wikitext103/bin)"),
        Dataset("enwik8", "enwik8", "lm", "bpc", "bet-prepare-enwik8 --raw-dir RAW --out-dir DATA/enwik8 "
                "(binarised: DATA/enwik8/bin)"),
    )
}


def named(name: str, datasets=MT_DATASETS + LM_DATASETS) -> Dict[str, str]:
    """The project's arch naming convention: {name}_iwslt, {name}_wmt_en_de, {name}_lm,
    {name}_lm_wikitext103, {name}_lm_enwik8."""
    pattern = {"iwslt14_de_en": "{}_iwslt", "wmt17_en_de": "{}_wmt_en_de", "wikitext2": "{}_lm",
               "wikitext103": "{}_lm_wikitext103", "enwik8": "{}_lm_enwik8"}
    return {d: pattern[d].format(name) for d in datasets}


def transformer(variant: str = "") -> Dict[str, str]:
    """fairseq's transformer sizes (+ a diagonal variant suffix): transformer_iwslt_de_en[_v], ..."""
    suffix = f"_{variant}" if variant else ""
    return {"iwslt14_de_en": f"transformer_iwslt_de_en{suffix}", "wmt17_en_de": f"transformer_wmt_en_de{suffix}",
            "wikitext2": f"transformer_lm_wikitext2{suffix}", "wikitext103": f"transformer_lm_wikitext103{suffix}",
            "enwik8": f"transformer_lm_enwik8{suffix}"}


# ----------------------------------------------------------------------------- rows


@dataclass
class Row:
    key: str
    label: str  # as in Table 2
    archs: Dict[str, str]  # dataset -> --arch
    paper: Dict[str, float]  # dataset -> the paper's number
    train_flags: Dict[str, Dict[str, object]] = field(default_factory=dict)  # kind -> {flag: value}
    eval_flags: Dict[str, Dict[str, object]] = field(default_factory=dict)  # kind -> {flag: value}
    needs_syntax_hints: bool = False
    note: str = ""


def _paper(*values):
    return {d: v for d, v in zip(MT_DATASETS + LM_DATASETS, values) if v is not None}


POINTER = {"--criterion": "label_smoothed_cross_entropy_with_pointer"}

ROWS: List[Row] = [
    Row("transformer", "Transformer", transformer(), _paper(35.26, 27.55, 54.53, 24.27, 1.164)),
    Row("reduced_diag", "Transformer (Reduced Diag)", transformer("reduced_diag"),
        _paper(35.39, 27.64, 54.22, 24.18, 1.158), note="diagonal of QK^T/sqrt(d) x 0.2"),
    Row("magnified_diag", "Transformer (Magnified Diag)", transformer("magnified_diag"),
        _paper(35.02, 26.89, 56.73, 25.86, 1.187), note="diagonal x 2.0"),
    Row("diagfree", "Transformer + DiagFreeMask", transformer("diagfree"), _paper(35.42, 27.67, 54.08, 24.05, 1.155)),
    Row("hopfield", "Hopfield (Ramsauer et al. 2020)", named("hopfield"), _paper(33.70, 25.44, 54.09, 26.45, 1.201)),
    Row("localness", "Yang et al. 2018 (Gaussian localness bias)", named("localness"),
        _paper(35.39, 27.64, 54.48, 24.21, 1.160)),
    Row("sparse_topk", "Zhao et al. 2019 (explicit top-k sparse attention)", named("sparse_topk"),
        _paper(35.51, 27.84, 54.39, 24.16, 1.159)),
    Row("transformer_xl", "Transformer-XL", named("transformer_xl", LM_DATASETS), _paper(None, None, 54.39, 24.00, 1.161),
        # The reference implementation keeps a memory at least as long as a segment (512 tokens here).
        train_flags={"lm": {"--task": "bet_truncated_bptt_lm", "--sample-break-mode": None, "--mem-len": 512}},
        # Evaluated as the reference code evaluates: every query sees the same number of positions
        # (--mem-len), and distances beyond 400 share one embedding (its WikiText-103 setting).
        eval_flags={"lm": {"--task": "bet_truncated_bptt_lm", "--context-window": None,
                           "--model-overrides": "{'same_length': True, 'clamp_len': 400}"}},
        note="segment recurrence: contiguous segments, eval without --context-window, with same_length and clamp_len"),
    Row("routing", "Routing Transformer", named("routing", LM_DATASETS), _paper(None, None, 53.81, 23.79, 1.158)),
    Row("bet_sg", "BET(SG)", named("bet_sg"), _paper(36.04, 28.43, 51.66, 23.34, 1.147),
        train_flags={"mt": {"--task": "translation_syntax_hints", **POINTER},
                     # checkpoint_best and --patience on the language-model loss alone (nll_loss: with label
                     # smoothing 0 it is the LM loss), not on a loss that includes lambda_p * L_p
                     "lm": {"--task": "language_modeling_syntax_hints", **POINTER, "--label-smoothing": 0.0,
                            "--sample-break-mode": "eos", "--skip-invalid-size-inputs-valid-test": True,
                            "--best-checkpoint-metric": "nll_loss"}},
        needs_syntax_hints=True,
        note="syntax pointer loss (--pointer-lambda, criterion default); hints from bet-syntax-hints"),
    Row("bet_sf", "BET(SF)", named("bet_sf"), _paper(35.85, 28.03, 52.97, 23.76, 1.153)),
    Row("bet_sf_nodiagmask", "BET(SF) - DiagFreeMask", named("bet_sf_nodiagmask"),
        _paper(35.67, 27.89, 53.50, 23.98, 1.156)),
]


def row(key: str) -> Row:
    for r in ROWS:
        if r.key == key:
            return r
    raise KeyError(f"unknown row {key!r}; rows: {', '.join(r.key for r in ROWS)}")
