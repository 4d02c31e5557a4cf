"""Syntax-hint files next to fairseq's binarised data, and a wrapper that puts them in the batch.

A hint file holds, per sentence, one integer per decoder *input* position
(``prev_output_tokens = [eos, y_1 .. y_n]``, so ``n + 1`` values = the target length with its eos):
the position whose token the pointer loss asks that position to attend to (BET_SPEC section 3).
``bet-syntax-hints`` writes them as fairseq mmap indexed datasets:

``{split}.hints.{tgt}.bin/.idx``  translation (``tgt`` = target language)
``{split}.hints.bin/.idx``        language modelling (``--sample-break-mode eos``)

``SyntaxHintDataset`` wraps the task's own dataset (LanguagePairDataset / MonolingualDataset):
every item carries its hint row, and the collater places each row in the batch row of the
sentence it belongs to (fairseq's collate re-sorts by source length), padded with ``-1`` to the
decoder input's width, shifted when the decoder input is left-padded.
"""

import os

import numpy as np
import torch

from fairseq.data import BaseWrapperDataset
from fairseq.data.indexed_dataset import MMapIndexedDataset

HINT_PAD = -1


class SyntaxHintError(ValueError):
    """A hint file that does not match the data it should annotate."""


def hint_prefix(data_dir: str, split: str, lang: str = None) -> str:
    """The path (without .bin/.idx) of a split's hint file."""
    name = f"{split}.hints.{lang}" if lang else f"{split}.hints"
    return os.path.join(data_dir, name)


def load_hint_file(prefix: str, required: bool):
    """The mmap dataset at ``prefix``; None if absent and not required, else a clear error."""
    if not MMapIndexedDataset.exists(prefix):
        if not required:
            return None
        raise FileNotFoundError(
            f"syntax-hint file not found: {prefix}.bin / {prefix}.idx (make it with "
            f"bet-syntax-hints from the BPE-segmented target text of this split)"
        )
    return MMapIndexedDataset(prefix)


def check_hint_sizes(hints, expected_sizes, hint_path: str, data_desc: str):
    """One hint per decoder input position: hint count == target length (tokens + eos), per line."""
    expected_sizes = np.asarray(expected_sizes)
    if len(hints) != len(expected_sizes):
        raise SyntaxHintError(
            f"{hint_path}: {len(hints)} lines of hints, but {data_desc} has {len(expected_sizes)} "
            f"sentences; the hint file was made from a different corpus"
        )
    bad = np.nonzero(np.asarray(hints.sizes) != expected_sizes)[0]
    if len(bad):
        i = int(bad[0])
        raise SyntaxHintError(
            f"{hint_path}: line {i + 1} has {int(hints.sizes[i])} hints, but sentence {i + 1} of "
            f"{data_desc} has {int(expected_sizes[i])} decoder positions (tokens + eos); "
            f"{len(bad)} line(s) differ in all"
        )


class SyntaxHintDataset(BaseWrapperDataset):
    """The task's dataset plus ``sample["syntax_hints"]`` (B x T, aligned with the decoder input).

    ``decoder_input_key``: ``prev_output_tokens`` (translation) or ``src_tokens`` (LM);
    ``left_pad``: whether that tensor is left-padded.
    """

    def __init__(self, dataset, hints, hint_path: str, pad_idx: int, decoder_input_key: str, left_pad=False):
        super().__init__(dataset)
        self.hints = hints
        self.hint_path = hint_path
        self.pad_idx = pad_idx
        self.decoder_input_key = decoder_input_key
        self.left_pad = left_pad

    def __getattr__(self, name):
        # the wrapped dataset's own attributes (src, tgt, tgt_sizes ...) stay reachable
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def _hint_row(self, index: int) -> torch.Tensor:
        row = self.hints[index].long()
        positions = torch.arange(len(row))
        bad = (row < 0) | (row > positions)
        if bad.any():
            t = int(bad.nonzero()[0])
            raise SyntaxHintError(
                f"{self.hint_path}: line {index + 1}, position {t}: hint {int(row[t])} is out of range "
                f"(a position may only point at itself or at an earlier position, 0..{t})"
            )
        return row

    def __getitem__(self, index):
        item = self.dataset[index]
        item["syntax_hints"] = self._hint_row(index)
        return item

    def collater(self, samples, **kwargs):
        batch = self.dataset.collater(samples, **kwargs)
        if len(samples) == 0 or "net_input" not in batch:
            return batch
        decoder_input = batch["net_input"][self.decoder_input_key]
        by_id = {int(s["id"]): s["syntax_hints"] for s in samples}
        hints = torch.full(decoder_input.shape, HINT_PAD, dtype=torch.long)
        width = decoder_input.size(1)
        for r, sample_id in enumerate(batch["id"].tolist()):
            row = by_id[sample_id]
            n = len(row)
            length = int(decoder_input[r].ne(self.pad_idx).sum())
            if n != length:
                raise SyntaxHintError(
                    f"{self.hint_path}: line {sample_id + 1} has {n} hints, but its decoder input has "
                    f"{length} positions in the batch"
                )
            offset = width - n if self.left_pad else 0
            hints[r, offset : offset + n] = row + offset
        batch["syntax_hints"] = hints
        return batch
