"""Attention of single sentences: per-layer matrices, and the top-k attended words (Table 3)."""

from typing import Dict, List, Optional, Sequence, Tuple

import torch

from bet_fairseq.errors import InputError
from bet_fairseq.attention.capture import capture_attention
from .attention_stats import decoder_input_tokens, move_to, right_padded, run_teacher_forced


@torch.no_grad()
def sentence_attention(loaded, sample: Dict) -> Dict:
    """Teacher-force one sentence. Returns ``input`` / ``target`` token strings (padding removed),
    ``final`` (list per layer of ``(heads, T, T)`` CPU tensors) and ``first_pass`` (BET(SF) layers,
    else None)."""
    model = loaded.model
    model.eval()
    net_input = right_padded(move_to(sample["net_input"], loaded.device), model.decoder.padding_idx)
    tokens = decoder_input_tokens(net_input)
    if tokens.size(0) != 1:
        raise ValueError("sentence_attention takes a one-sentence sample")
    with capture_attention(model, convert=True) as captured:
        run_teacher_forced(model, net_input)
        keep = tokens[0].ne(model.decoder.padding_idx)
        idx = keep.nonzero().squeeze(1)
        layers = captured.layers()
        final = [layer.probs[0][:, idx][:, :, idx].float().cpu() for layer in layers]
        first = [None if layer.first_pass is None else layer.first_pass[0][:, idx][:, :, idx].float().cpu()
                 for layer in layers]
    d = loaded.decoder_dictionary
    input_ids = tokens[0][idx].tolist()
    target = None
    if sample.get("target") is not None and sample["target"].size(-1) == tokens.size(-1):
        # Targets are aligned with the decoder input: position i predicts target i.
        target = sample["target"][0][idx.cpu()].tolist()
    return {
        "input": [d[i] for i in input_ids],
        "target": None if target is None else [d[i] for i in target],
        "final": final,
        "first_pass": first if any(f is not None for f in first) else None,
    }


def bpe_words(pieces: Sequence[str], marker: Optional[str] = "@@") -> Tuple[List[int], List[str]]:
    """Group subword pieces into words: a piece ending in ``marker`` continues into the next one.
    Returns the word number of each piece and the words (marker removed)."""
    word_of, words, current = [], [], ""
    for piece in pieces:
        word_of.append(len(words))
        if marker and piece.endswith(marker) and len(piece) > len(marker):
            current += piece[: -len(marker)]
        else:
            words.append(current + piece)
            current = ""
    if current:
        words.append(current)
    return word_of, words


def top_k_words(row: torch.Tensor, pieces: Sequence[str], k: int = 3, marker: Optional[str] = "@@"):
    """The ``k`` most attended words of one attention row over the whole sentence's ``pieces``
    (weights of a word's pieces summed; keys after the query have weight 0 and words with no
    weight are never listed). Returns ``[(word, weight), ...]``, largest first."""
    if row.numel() != len(pieces):
        raise ValueError(f"attention row has {row.numel()} keys but the sentence has {len(pieces)} pieces")
    word_of, words = bpe_words(pieces, marker)
    weights = torch.zeros(len(words), dtype=torch.float64)
    weights.index_add_(0, torch.tensor(word_of), row.double())
    visible = sorted({word_of[j] for j in range(len(pieces)) if row[j] > 0})
    ranked = sorted(visible, key=lambda w: -float(weights[w]))[:k]
    return [(words[w], float(weights[w])) for w in ranked]


def head_view(matrix: torch.Tensor, head: Optional[int]) -> torch.Tensor:
    """``(heads, T, T)`` -> ``(T, T)``: the mean over heads, or one head."""
    if head is None:
        return matrix.mean(dim=0)
    if not 0 <= head < matrix.size(0):
        raise InputError(f"--head {head}: the model has {matrix.size(0)} heads (0..{matrix.size(0) - 1})")
    return matrix[head]


def _cell(pairs):
    return ", ".join(f"{w.replace('|', '&#124;')} ({p:.2f})" for w, p in pairs) or "-"


def _display(text: str, marker: Optional[str]) -> str:
    if marker:
        text = text.replace(marker + " ", "")
        if text.endswith(marker):
            text = text[: -len(marker)]
    return text.replace("|", "&#124;")


def topk_markdown(title: str, attentions: List[Dict], labels: List[str], k: int = 3, head: Optional[int] = None,
                  matrix: str = "final", positions: Optional[Sequence[int]] = None,
                  marker: Optional[str] = "@@") -> str:
    """Side-by-side Markdown: for each predicted position and layer, each model's top-k words.

    ``attentions``: one ``sentence_attention`` result per model, for the same sentence (their
    tokenisations must agree). Row ``i`` of a matrix is the query at input position ``i``, which
    predicts target token ``i``.
    """
    first = attentions[0]
    for other, label in zip(attentions[1:], labels[1:]):
        if other["input"] != first["input"]:
            raise InputError(f"{label}: the sentence is tokenised differently than for {labels[0]} "
                             "(different dictionaries?); top-k tables cannot be put side by side")
    pieces = first["input"]
    targets = first["target"] or pieces[1:] + ["</s>"]
    n = len(pieces)
    rows = range(n) if positions is None else positions
    for p in rows:
        if not 0 <= p < n:
            raise InputError(f"position {p} out of range: the sentence has {n} decoder positions (0..{n - 1})")
    mats = []
    for att, label in zip(attentions, labels):
        layers = att["first_pass"] if matrix == "first_pass" else att["final"]
        if layers is None:
            raise InputError(f"{label}: no first-pass matrix (not a BET(SF) model); use --matrix final")
        mats.append([head_view(m, head) for m in layers])
    num_layers = max(len(m) for m in mats)
    target_words = bpe_words(targets, marker)
    lines = [f"#### {title}", "", f"Target: {_display(' '.join(targets), marker)}", "",
             "| predicting | layer | " + " | ".join(f"{lb}: top-{k}" for lb in labels) + " |",
             "|---|---|" + "---|" * len(labels)]
    for p in rows:
        word = target_words[1][target_words[0][p]] if target_words[0] else targets[p]
        piece = targets[p]
        shown = word if (not marker or piece == word) else f"{piece} (of {word})"
        for layer in range(num_layers):
            cells = [_cell(top_k_words(m[layer][p], pieces, k, marker)) if layer < len(m) else "-"
                     for m in mats]
            first_col = f"`{shown}` (pos {p})" if layer == 0 else ""
            lines.append(f"| {first_col} | {layer + 1} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
