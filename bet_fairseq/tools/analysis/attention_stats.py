"""Table 1 statistics of decoder self-attention (the paper's Table 1), accumulated in a stream.

Per decoder layer, over every sentence and row of the causal self-attention matrix:

``CA``        mean diagonal weight ``A[i, i]``;
``HA(mean)``  mean of the strictly-lower-triangular weights ``A[i, j]``, ``j < i`` ("historical tokens");
``HA(std)``   their population standard deviation (ddof = 0);
``Ratio``     ``CA / HA(mean)``.

Defaults are the paper's definitions (compare with Table 1 under these):

``ca_rows="all"``        CA is the mean of ALL diagonal weights, row 0 included. Row 0 (a sequence's
                         first real position) can only attend to itself (weight 1 in every mode);
                         ``"skip-first"`` leaves it out of CA. HA does not depend on the choice.
``ha_over="head-mean"``  the statistics are taken over the entries of the head-averaged matrix (the
                         attention matrix as fairseq reports it: mean over heads first); ``"heads"``
                         takes them over every head's own entries. HA(mean) and CA are the same either
                         way (a mean is linear); HA(std) differs.

Padding is excluded: a row counts only when its query is a real token, an entry only when query and
key are both real tokens. Rows are numbered from a sequence's first real token, so "row 0" is the
first real decoder input (the ``</s>`` that starts a target in translation).

Only sums, sums of squares and counts (float64) are kept per layer, so memory does not grow with
the split.
"""

import math
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional

import torch

MATRICES = ("final", "first_pass")
MATRIX_TITLES = {
    "final": "A' (BET(SF) final attention, the one the layer uses)",
    "first_pass": "A (BET(SF) first pass)",
}


CA_ROWS = ("all", "skip-first")
HA_OVER = ("head-mean", "heads")
CA_ROWS_TEXT = {
    "all": "CA = mean of all diagonal weights, row 0 included (the paper's definition)",
    "skip-first": "CA = mean of the diagonal weights, row 0 excluded (not the paper's definition)",
}
HA_OVER_TEXT = {
    "head-mean": "CA, HA(mean), HA(std) over the entries of the head-averaged matrix "
                 "(fairseq's attention; the paper's definition)",
    "heads": "CA, HA(mean), HA(std) over every head's own entries (not the paper's definition)",
}


def check_definition(ca_rows: str, ha_over: str, include_first_row: Optional[bool] = None):
    """``(ca_rows, ha_over)`` validated; ``include_first_row`` (the old switch), when given, sets ``ca_rows``."""
    if include_first_row is not None:
        ca_rows = "all" if include_first_row else "skip-first"
    if ca_rows not in CA_ROWS:
        raise ValueError(f"ca_rows must be one of {CA_ROWS}, got {ca_rows!r}")
    if ha_over not in HA_OVER:
        raise ValueError(f"ha_over must be one of {HA_OVER}, got {ha_over!r}")
    return ca_rows, ha_over


def definition_text(ca_rows: str = "all", ha_over: str = "head-mean") -> str:
    """The one line that says which definitions a table uses."""
    return f"Definitions: {CA_ROWS_TEXT[ca_rows]}; {HA_OVER_TEXT[ha_over]}."


def definition_fields(ca_rows: str = "all", ha_over: str = "head-mean") -> Dict[str, object]:
    """The JSON fields naming the definitions (``include_first_row`` kept for older readers)."""
    return {"ca_rows": ca_rows, "ha_over": ha_over, "include_first_row": ca_rows == "all",
            "definition": definition_text(ca_rows, ha_over)}


def matrix_titles(matrices) -> Dict[str, str]:
    """Headings: BET(SF) layers have A and A'; every other mode has one matrix, A."""
    if "first_pass" in matrices:
        return {m: MATRIX_TITLES[m] for m in matrices}
    return {"final": "A (decoder self-attention)"}


@dataclass
class LayerSums:
    diag_sum: float = 0.0
    diag_count: int = 0
    hist_sum: float = 0.0
    hist_sumsq: float = 0.0
    hist_count: int = 0

    def add(self, other: "LayerSums"):
        self.diag_sum += other.diag_sum
        self.diag_count += other.diag_count
        self.hist_sum += other.hist_sum
        self.hist_sumsq += other.hist_sumsq
        self.hist_count += other.hist_count

    def summary(self) -> Dict[str, float]:
        ca = self.diag_sum / self.diag_count if self.diag_count else math.nan
        if self.hist_count:
            ha = self.hist_sum / self.hist_count
            var = max(self.hist_sumsq / self.hist_count - ha * ha, 0.0)
            ha_std = math.sqrt(var)
        else:
            ha = ha_std = math.nan
        ratio = ca / ha if ha and not math.isnan(ha) else math.nan
        return {"CA": ca, "HA_mean": ha, "HA_std": ha_std, "Ratio": ratio,
                "diag_count": self.diag_count, "hist_count": self.hist_count}


def batch_sums(probs: torch.Tensor, valid: torch.Tensor, ca_rows: str = "all", ha_over: str = "head-mean",
               include_first_row: Optional[bool] = None) -> LayerSums:
    """Sums of one batch of attention matrices.

    probs: ``(B, H, T, T)`` causal self-attention of a full (teacher-forced) sequence.
    valid: ``(B, T)`` boolean, True at real (non-padding) tokens.
    ca_rows / ha_over: the definitions (module docstring); counts are entries of the matrix used
    (the head-averaged one, or every head's).
    """
    ca_rows, ha_over = check_definition(ca_rows, ha_over, include_first_row)
    if probs.dim() != 4 or probs.size(-1) != probs.size(-2):
        raise ValueError(f"expected (batch, heads, T, T) attention, got shape {tuple(probs.shape)}")
    bsz, heads, tgt, _ = probs.shape
    if tuple(valid.shape) != (bsz, tgt):
        raise ValueError(f"valid mask shape {tuple(valid.shape)} does not match attention {tuple(probs.shape)}")
    valid = valid.to(device=probs.device, dtype=torch.bool)
    p = probs.detach().double()
    if ha_over == "head-mean":
        p = p.mean(dim=1, keepdim=True)  # fairseq's head-averaged matrix, as one "head"
        heads = 1
    # Row numbers from each sequence's first real token (left or right padding alike).
    row = valid.long().cumsum(dim=1) - 1
    rows = valid if ca_rows == "all" else valid & (row > 0)
    diag = torch.diagonal(p, dim1=-2, dim2=-1)  # (B, H, T)
    # torch.where rather than multiplication: rows of padding may hold NaN (no visible key).
    diag_sum = torch.where(rows.unsqueeze(1), diag, 0.0).sum()
    lower = torch.ones(tgt, tgt, dtype=torch.bool, device=p.device).tril(-1)
    hist = valid.unsqueeze(2) & valid.unsqueeze(1) & lower  # (B, T, T)
    hist_vals = torch.where(hist.unsqueeze(1), p, 0.0)
    return LayerSums(
        diag_sum=float(diag_sum),
        diag_count=int(rows.sum()) * heads,
        hist_sum=float(hist_vals.sum()),
        hist_sumsq=float((hist_vals * hist_vals).sum()),
        hist_count=int(hist.sum()) * heads,
    )


class AttentionStatsAccumulator:
    """Running Table 1 sums per matrix kind (``final`` / ``first_pass``) and decoder layer."""

    def __init__(self, num_layers: int, ca_rows: str = "all", ha_over: str = "head-mean",
                 include_first_row: Optional[bool] = None):
        self.num_layers = num_layers
        self.ca_rows, self.ha_over = check_definition(ca_rows, ha_over, include_first_row)
        self.sums: Dict[str, List[Optional[LayerSums]]] = {m: [None] * num_layers for m in MATRICES}
        self.sentences = 0
        self.tokens = 0

    def add(self, matrix: str, layer: int, probs: torch.Tensor, valid: torch.Tensor):
        if matrix not in self.sums:
            raise ValueError(f"unknown matrix {matrix!r}; one of {MATRICES}")
        part = batch_sums(probs, valid, self.ca_rows, self.ha_over)
        if self.sums[matrix][layer] is None:
            self.sums[matrix][layer] = LayerSums()
        self.sums[matrix][layer].add(part)

    def add_attentions(self, captured, valid: torch.Tensor):
        """Add what each layer recorded in the last forward (``AttentionCapture.layers()``)."""
        for layer, record in enumerate(captured):
            if record.probs is None:
                raise RuntimeError(f"decoder layer {layer + 1} captured no attention")
            self.add("final", layer, record.probs, valid)
            if record.first_pass is not None:
                self.add("first_pass", layer, record.first_pass, valid)
        self.sentences += int(valid.size(0))
        self.tokens += int(valid.sum())

    def definition(self) -> Dict[str, object]:
        """JSON fields naming the definitions used (``ca_rows``, ``ha_over``, ``definition``)."""
        return definition_fields(self.ca_rows, self.ha_over)

    def result(self) -> Dict[str, List[Optional[Dict[str, float]]]]:
        out = {}
        for matrix, layers in self.sums.items():
            if any(s is not None for s in layers):
                out[matrix] = [None if s is None else dict(layer=i + 1, **s.summary()) for i, s in enumerate(layers)]
        return out


def decoder_input_tokens(net_input) -> torch.Tensor:
    """The tokens fed to the decoder: ``prev_output_tokens`` (translation) or ``src_tokens`` (LM)."""
    if "prev_output_tokens" in net_input and net_input["prev_output_tokens"] is not None:
        return net_input["prev_output_tokens"]
    return net_input["src_tokens"]


def right_padded(net_input, pad_idx: int):
    """``net_input`` with the decoder input moved to right padding where it is left-padded.

    A left-padded decoder input has padding queries with no visible key; the exact attention
    path turns those rows into NaN, which later layers spread through the padded values. fairseq's
    positions skip padding, so right-aligning the tokens changes nothing for the real ones.
    """
    key = "prev_output_tokens" if net_input.get("prev_output_tokens") is not None else "src_tokens"
    tokens = net_input[key]
    valid = tokens.ne(pad_idx)
    if tokens.size(1) < 2 or bool((valid[:, 1:] <= valid[:, :-1]).all()):
        return net_input
    order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices
    return dict(net_input, **{key: tokens.gather(1, order)})


def run_teacher_forced(model, net_input):
    """One teacher-forced pass (fairseq transformers skip the output projection with features_only)."""
    return model(**net_input, features_only=True)


@torch.no_grad()
def collect_attention_stats(model, attentions, batches: Iterable, pad_idx: int,
                            include_first_row: Optional[bool] = None, device=None, progress=None,
                            ca_rows: str = "all", ha_over: str = "head-mean") -> AttentionStatsAccumulator:
    """Teacher-force ``model`` over ``batches`` (fairseq samples) and accumulate Table 1 sums.

    ``attentions``: the decoder self-attention modules (``attention.capture.decoder_self_attentions``);
    capture is switched on for the duration. ``progress``: an optional callable wrapping the iterable (tqdm).
    ``ca_rows`` / ``ha_over``: the definitions (default: the paper's); ``include_first_row``, when
    given, sets ``ca_rows`` (the old switch).
    """
    from bet_fairseq.attention.capture import capture_attention

    was_training = model.training
    model.eval()
    acc = AttentionStatsAccumulator(len(attentions), ca_rows, ha_over, include_first_row)
    iterable = progress(batches) if progress is not None else batches
    try:
        with capture_attention(attentions) as captured:
            for sample in iterable:
                if not sample or "net_input" not in sample:
                    continue
                net_input = right_padded(move_to(sample["net_input"], device), pad_idx)
                captured.clear()  # never count a previous batch's matrix twice
                run_teacher_forced(model, net_input)
                valid = decoder_input_tokens(net_input).ne(pad_idx)
                acc.add_attentions(captured.layers(), valid)
    finally:
        model.train(was_training)
    return acc


def move_to(obj, device):
    if device is None:
        return obj
    if torch.is_tensor(obj):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: move_to(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(move_to(v, device) for v in obj)
    return obj


# ----------------------------------------------------------------------------------------------
def _fmt(value, digits):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def markdown_table(layers: List[Optional[Dict[str, float]]], title: Optional[str] = None,
                   definition: Optional[str] = None) -> str:
    """Table 1 layout: rows CA / HA(mean) / HA(std) / Ratio, one column per decoder layer;
    ``definition`` (``definition_text``), when given, is the line under the table."""
    n = len(layers)
    lines = []
    if title:
        lines += [f"**{title}**", ""]
    lines.append("| | " + " | ".join(str(i + 1) for i in range(n)) + " |")
    lines.append("|---|" + "---|" * n)
    for label, key, digits in (("CA", "CA", 4), ("HA(mean)", "HA_mean", 4), ("HA(std)", "HA_std", 4),
                               ("Ratio", "Ratio", 2)):
        cells = [_fmt(None if s is None else s[key], digits) for s in layers]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if definition:
        lines += ["", definition]
    return "\n".join(lines) + "\n"


def markdown_report(result: Dict, label: str = "") -> str:
    """All matrices of one ``stats`` result (a dict with ``matrices``) as Markdown."""
    parts = []
    head = label or result.get("checkpoint", "")
    if head:
        parts.append(f"### {head}\n")
    meta = []
    for key in ("arch", "self_attn_mode", "split", "sentences", "tokens"):
        if result.get(key) is not None:
            meta.append(f"{key} = {result[key]}")
    parts.append(", ".join(meta) + "\n")
    definition = result.get("definition") or definition_text(
        *check_definition(result.get("ca_rows", "all"), result.get("ha_over", "head-mean")))
    titles = result.get("matrix_titles") or matrix_titles(result["matrices"])
    for matrix, layers in result["matrices"].items():
        parts.append(markdown_table(layers, titles.get(matrix, matrix), definition))
    return "\n".join(parts)
