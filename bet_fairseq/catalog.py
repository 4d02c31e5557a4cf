"""The catalog: every dataset and every row of the paper, and the one rule that names architectures.

Pure Python (imports neither torch nor fairseq). Everything above the attention layer reads it: the
architectures (``models/architectures.py``), the recipes (``recipes.py``), the Table 2 driver and table
(``bet-run-row``, ``bet-results``), the run scripts, the study (``bet-reproduce``), the demo and the
benchmarks. Adding a row is one ``Row(...)`` in ``ROWS``; adding a dataset is one ``Dataset(...)`` in
``DATASETS`` plus its preparation module (``preprocess/``).

The naming rule: the architecture of row ``R`` at size ``S`` is ``{R}_{S.suffix}`` (``bet_sf_iwslt``,
``vanilla_lm_enwik8``); version 0.1's names stay registered as aliases (``legacy_arch_names``).
"""

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

Flags = Dict[str, object]  # fairseq command-line options, {"--flag": value} (see recipes.to_argv)

METRICS = {"bleu": "higher", "ppl": "lower", "bpc": "lower"}  # metric -> which direction is better
KINDS = ("mt", "lm")  # translation, language modelling


# ----------------------------------------------------------------------------- architecture sizes


@dataclass(frozen=True)
class Size:
    """The sizes of one family of architectures.

    ``suffix``: the architecture-name suffix. ``fairseq_sizes``: translation, the fairseq architecture function
    (``fairseq.models.transformer``) whose sizes it takes. ``dims``: language models, the decoder sizes
    (6 layers, post-norm as the paper's). ``legacy``: the size's name in version 0.1's architecture names.
    """

    suffix: str
    kind: str
    fairseq_sizes: Optional[str] = None
    dims: Dict[str, int] = field(default_factory=dict)
    legacy: str = ""


IWSLT = Size("iwslt", "mt", fairseq_sizes="transformer_iwslt_de_en", legacy="iwslt_de_en")
WMT = Size("wmt_en_de", "mt", fairseq_sizes="transformer_wmt_en_de", legacy="wmt_en_de")
# The paper's LM settings and the authors' code; WikiText-103 takes 6 heads: the authors' 8 do not divide 300.
LM_WIKITEXT2 = Size("lm", "lm", dims=dict(decoder_embed_dim=300, decoder_ffn_embed_dim=1200,
                                          decoder_attention_heads=4), legacy="wikitext2")
LM_WIKITEXT103 = Size("lm_wikitext103", "lm", dims=dict(decoder_embed_dim=300, decoder_ffn_embed_dim=1200,
                                                        decoder_attention_heads=6), legacy="wikitext103")
LM_ENWIK8 = Size("lm_enwik8", "lm", dims=dict(decoder_embed_dim=512, decoder_ffn_embed_dim=2048,
                                              decoder_attention_heads=4), legacy="enwik8")


# ----------------------------------------------------------------------------- datasets


@dataclass(frozen=True)
class Dataset:
    """One corpus.

    ``train``: its own fairseq-train flags on top of its kind's recipe (``recipes.py``); ``recipe``: the key of
    another dataset whose flags it takes instead. ``paper``: the dataset whose Table 2 numbers it is compared
    with (its own key for a Table 2 column); ``paper_comparable``: False where the corpus differs from the
    paper's (compare only the direction of a difference). ``study``: in the study's default plan.
    """

    key: str
    label: str
    kind: str
    metric: str
    size: Size
    prepare: str  # the command that makes its binarised folder
    train: Flags = field(default_factory=dict)
    recipe: Optional[str] = None
    column: Optional[str] = None  # its Table 2 column header (None: not a column of Table 2)
    paper: Optional[str] = None
    paper_comparable: bool = True
    source: Optional[str] = None
    target: Optional[str] = None
    study: bool = False

    @property
    def higher_is_better(self) -> bool:
        return METRICS[self.metric] == "higher"

    @property
    def in_table2(self) -> bool:
        return self.column is not None


def _prepare(command: str, folder: str) -> str:
    return f"{command} --out-dir DATA/{folder} (binarised: DATA/{folder}/bin)"


_DATASET_LIST = [
    Dataset("iwslt14_de_en", "IWSLT14 De-En", "mt", "bleu", IWSLT, _prepare("bet-prepare-iwslt14 --raw-dir RAW", "iwslt14"),
            train={"--task": "translation", "--source-lang": "de", "--target-lang": "en", "--max-epoch": 50},
            column="De-En", paper="iwslt14_de_en", source="de", target="en"),
    Dataset("wmt17_en_de", "WMT17 En-De", "mt", "bleu", WMT, _prepare("bet-prepare-wmt17 --raw-dir RAW", "wmt17"),
            train={"--task": "translation", "--source-lang": "en", "--target-lang": "de", "--max-update": 100000},
            column="En-De", paper="wmt17_en_de", source="en", target="de"),
    Dataset("wikitext2", "WikiText-2", "lm", "ppl", LM_WIKITEXT2,
            _prepare("bet-prepare-wikitext --dataset wikitext-2 --raw-dir RAW", "wikitext2"),
            train={"--dropout": 0.3, "--warmup-updates": 1000, "--max-epoch": 200, "--patience": 10},
            column="WikiText-2", paper="wikitext2", study=True),
    Dataset("wikitext103", "WikiText-103", "lm", "ppl", LM_WIKITEXT103,
            _prepare("bet-prepare-wikitext --dataset wikitext-103 --raw-dir RAW", "wikitext103"),
            train={"--max-update": 200000}, column="WikiText-103", paper="wikitext103"),
    Dataset("enwik8", "enwik8", "lm", "bpc", LM_ENWIK8, _prepare("bet-prepare-enwik8 --raw-dir RAW", "enwik8"),
            train={"--max-update": 200000}, column="enwik8", paper="enwik8"),
    # The study's small real translation corpus (not in the paper): IWSLT14's recipe and sizes.
    Dataset("multi30k", "Multi30k De-En", "mt", "bleu", IWSLT,
            "bet-reproduce --data-dir DIR (or python run/demo_side_by_side.py --data-dir DIR)",
            recipe="iwslt14_de_en", paper="iwslt14_de_en", paper_comparable=False, source="de", target="en",
            study=True),
]
DATASETS: Dict[str, Dataset] = {d.key: d for d in _DATASET_LIST}


def dataset(key: str) -> Dataset:
    if key not in DATASETS:
        raise KeyError(f"unknown dataset {key!r}; datasets: {', '.join(DATASETS)}")
    return DATASETS[key]


def table2_datasets() -> List[Dataset]:
    """The columns of Table 2, in the paper's order."""
    return [d for d in DATASETS.values() if d.in_table2]


def sizes() -> List[Size]:
    """Every architecture size the datasets use, once each."""
    found: Dict[str, Size] = {}
    for d in DATASETS.values():
        found.setdefault(d.size.suffix, d.size)
    return list(found.values())


# ----------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class Row:
    """One system of Table 2 (or an architecture family beside it).

    ``attention``: the model options its architectures set (``self_attn_mode`` and that variant's options);
    ``needs``: options the user must give (``--diag-scale C``); ``layers``: the decoder layers that take its
    attention, from the number of layers (default: all). ``kinds``: the kinds of dataset Table 2 runs it on.
    ``train_flags`` / ``eval_flags``: per kind, flags beyond the dataset's recipe (``None`` removes one).
    ``own_model``: its architectures are registered by its own model file (Transformer-XL), by this rule.
    ``paper``: dataset key -> the paper's number.
    """

    key: str
    label: str
    attention: Dict[str, object] = field(default_factory=dict)
    paper: Dict[str, float] = field(default_factory=dict)
    kinds: Tuple[str, ...] = KINDS
    train_flags: Dict[str, Flags] = field(default_factory=dict)
    eval_flags: Dict[str, Flags] = field(default_factory=dict)
    needs: Tuple[str, ...] = ()
    layers: Optional[Callable[[int], str]] = None
    needs_syntax_hints: bool = False
    own_model: bool = False
    in_table2: bool = True
    note: str = ""

    def covers(self, dataset_key: str) -> bool:
        """Whether Table 2 (and so ``bet-run-row``) runs this row on the dataset."""
        return self.in_table2 and dataset(dataset_key).kind in self.kinds

    def arch(self, dataset_key: str) -> str:
        return arch_name(self.key, dataset(dataset_key).size)


def _paper(*values) -> Dict[str, float]:
    """The paper's numbers in Table 2's column order (De-En, En-De, WikiText-2, WikiText-103, enwik8)."""
    columns = ("iwslt14_de_en", "wmt17_en_de", "wikitext2", "wikitext103", "enwik8")
    return {d: v for d, v in zip(columns, values) if v is not None}


# BET(SG)'s pointer-loss setting (the paper gives no lambda_p): the criteria's defaults, so the row's runs use it.
# Chosen by the study's sweep on Multi30k validation nll (bet-reproduce --part pointer; docs/bet_sg.md).
POINTER_DEFAULT = {"pointer_lambda": 0.002, "pointer_heads": "first"}
# written out in the row's commands (last, where a sweep point's flags go): a run's command says its setting, so a
# new default changes the commands of the runs made with the old one, and the default's runs are the sweep point's
_POINTER_SETTING = {"--pointer-lambda": POINTER_DEFAULT["pointer_lambda"],
                    "--pointer-heads": POINTER_DEFAULT["pointer_heads"]}
_POINTER = {"--criterion": "label_smoothed_cross_entropy_with_pointer"}

_ROW_LIST = [
    Row("vanilla", "Transformer", dict(self_attn_mode="vanilla"), _paper(35.26, 27.55, 54.53, 24.27, 1.164)),
    Row("reduced_diag", "Transformer (Reduced Diag)", dict(self_attn_mode="diag_scale", diag_scale=0.2),
        _paper(35.39, 27.64, 54.22, 24.18, 1.158), note="diagonal of QK^T/sqrt(d) x 0.2"),
    Row("magnified_diag", "Transformer (Magnified Diag)", dict(self_attn_mode="diag_scale", diag_scale=2.0),
        _paper(35.02, 26.89, 56.73, 25.86, 1.187), note="diagonal x 2.0"),
    Row("diagfree", "Transformer + DiagFreeMask", dict(self_attn_mode="diag_free"),
        _paper(35.42, 27.67, 54.08, 24.05, 1.155)),
    Row("diag_scale", "Transformer (diagonal x C)", dict(self_attn_mode="diag_scale"), needs=("diag_scale",),
        in_table2=False, note="Figure 3's sweep: --diag-scale C"),
    Row("hopfield", "Hopfield (Ramsauer et al. 2020)", dict(self_attn_mode="hopfield"),
        _paper(33.70, 25.44, 54.09, 26.45, 1.201)),
    # Yang et al. 2018 found localness best in the lower layers (1-3 of 6): the lower half.
    Row("localness", "Yang et al. 2018 (Gaussian localness bias)", dict(self_attn_mode="localness"),
        _paper(35.39, 27.64, 54.48, 24.21, 1.160), layers=lambda n: f"0-{max(n // 2, 1) - 1}"),
    Row("sparse_topk", "Zhao et al. 2019 (explicit top-k sparse attention)", dict(self_attn_mode="sparse_topk"),
        _paper(35.51, 27.84, 54.39, 24.16, 1.159)),
    Row("transformer_xl", "Transformer-XL", paper=_paper(None, None, 54.39, 24.00, 1.161), kinds=("lm",),
        own_model=True,
        # The reference implementation keeps a memory at least as long as a segment (512 tokens here).
        train_flags={"lm": {"--task": "bet_truncated_bptt_lm", "--sample-break-mode": None, "--mem-len": 512}},
        # Evaluated as the reference code evaluates: every query sees the same number of positions
        # (--mem-len), and distances beyond 400 share one embedding (its WikiText-103 setting).
        eval_flags={"lm": {"--task": "bet_truncated_bptt_lm", "--context-window": None,
                           "--model-overrides": "{'same_length': True, 'clamp_len': 400}"}},
        note="segment recurrence: contiguous segments, eval without --context-window, with same_length and clamp_len"),
    Row("routing", "Routing Transformer", dict(self_attn_mode="routing"), _paper(None, None, 53.81, 23.79, 1.158),
        kinds=("lm",)),
    Row("bet_sg", "BET(SG)", dict(self_attn_mode="vanilla"), _paper(36.04, 28.43, 51.66, 23.34, 1.147),
        # checkpoint_best and --patience on the token loss alone (nll_loss; the LM's with label smoothing 0), not
        # on the training loss, which includes lambda_p * L_p (also where the recipe would select on BLEU)
        train_flags={"mt": {"--task": "translation_syntax_hints", **_POINTER, "--best-checkpoint-metric": "nll_loss",
                            "--maximize-best-checkpoint-metric": None, **_POINTER_SETTING},
                     "lm": {"--task": "language_modeling_syntax_hints", **_POINTER, "--label-smoothing": 0.0,
                            "--sample-break-mode": "eos", "--skip-invalid-size-inputs-valid-test": True,
                            "--best-checkpoint-metric": "nll_loss", **_POINTER_SETTING}},
        needs_syntax_hints=True,
        note="syntax pointer loss (--pointer-lambda / --pointer-heads: POINTER_DEFAULT); hints from bet-syntax-hints"),
    Row("bet_sf", "BET(SF)", dict(self_attn_mode="bet_sf"), _paper(35.85, 28.03, 52.97, 23.76, 1.153)),
    Row("bet_sf_nodiagmask", "BET(SF) - DiagFreeMask", dict(self_attn_mode="bet_sf", bet_keep_diagonal=True),
        _paper(35.67, 27.89, 53.50, 23.98, 1.156)),
]
ROWS: Dict[str, Row] = {r.key: r for r in _ROW_LIST}
ROW_ALIASES = {"transformer": "vanilla"}  # row keys of version 0.2's Table 2 driver and study


def row(key: str) -> Row:
    key = ROW_ALIASES.get(key, key)
    if key not in ROWS:
        raise KeyError(f"unknown row {key!r}; rows: {', '.join(ROWS)}")
    return ROWS[key]


def table2_rows() -> List[Row]:
    return [r for r in ROWS.values() if r.in_table2]


def rows_on(dataset_key: str) -> List[Row]:
    """The Table 2 rows run on a dataset."""
    return [r for r in ROWS.values() if r.covers(dataset_key)]


# ----------------------------------------------------------------------------- the naming rule


def arch_name(row_key: str, size: Size) -> str:
    """The one naming rule: ``{row}_{size suffix}``."""
    return f"{row_key}_{size.suffix}"


def arch_names() -> Dict[str, Tuple[Row, Size]]:
    """{architecture name: (row, size)} of every row at every size (canonical names)."""
    return {arch_name(r.key, s): (r, s) for r in ROWS.values() for s in sizes()}


def legacy_arch_names() -> Dict[str, str]:
    """{version 0.1 name: canonical name}: ``bet_vanilla_{mt size}``, ``transformer_{fairseq size}_{diag row}``,
    ``transformer_lm_{corpus}`` and ``transformer_lm_{corpus}_{diag row}``."""
    diagonal_rows = ("reduced_diag", "magnified_diag", "diag_scale", "diagfree")
    aliases = {}
    for s in sizes():
        if s.kind == "mt":
            aliases[f"bet_vanilla_{s.suffix}"] = arch_name("vanilla", s)
            prefix = f"transformer_{s.legacy}"
        else:
            aliases[f"transformer_lm_{s.legacy}"] = arch_name("vanilla", s)
            prefix = f"transformer_lm_{s.legacy}"
        for r in diagonal_rows:
            aliases[f"{prefix}_{r}"] = arch_name(r, s)
    return aliases


# fairseq's own architectures that are a row's architecture (same sizes, vanilla attention): an ``--arch`` of
# the Table 2 driver or the main job may name them.
FAIRSEQ_EQUIVALENTS = {"transformer_iwslt_de_en": "vanilla_iwslt", "transformer_wmt_en_de": "vanilla_wmt_en_de"}


def row_of_arch(arch: str) -> Optional[Row]:
    """The row whose architecture ``arch`` is (a canonical name, a version 0.1 alias or a fairseq equivalent)."""
    arch = FAIRSEQ_EQUIVALENTS.get(arch, legacy_arch_names().get(arch, arch))
    found = arch_names().get(arch)
    return found[0] if found else None
