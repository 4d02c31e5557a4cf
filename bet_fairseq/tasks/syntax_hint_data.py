"""Syntax-hint files next to fairseq's binarised data, and a wrapper that puts them in the batch.

A hint file holds, per sentence, one integer per decoder *input* position
(``prev_output_tokens = [eos, y_1 .. y_n]``, so ``n + 1`` values = the target length with its eos):
the position whose token the pointer loss asks that position to attend to (the paper's BET(SG), section 3).
``bet-syntax-hints`` writes them as fairseq mmap indexed datasets:

``{split}.hints.{tgt}.bin/.idx``  translation (``tgt`` = target language)
``{split}.hints.bin/.idx``        language modelling (``--sample-break-mode eos``)

``SyntaxHintDataset`` wraps the task's own dataset (LanguagePairDataset / MonolingualDataset):
every item carries its hint row, and the collater places each row in the batch row of the
sentence it belongs to (fairseq's collate re-sorts by source length), padded with ``-1`` to the
decoder input's width, shifted when the decoder input is left-padded.
"""

import os
import struct

import numpy as np
import torch

from fairseq.data import BaseWrapperDataset
from fairseq.data.indexed_dataset import MMapIndexedDataset, _code_to_dtype

from ..syntax_hint_batch import HINT_PAD, SYNTAX_HINTS
from ..errors import InputError


class SyntaxHintError(InputError):
    """A hint file that does not match the data it should annotate."""


class MissingHintFile(SyntaxHintError, FileNotFoundError):
    """A split's hint file is not there (one line at the top of fairseq-train, like every SyntaxHintError)."""


def load_hint_file(prefix: str, required: bool):
    """The mmap dataset at ``prefix``; None if absent and not required, else a clear error.
    A truncated or mismatched .bin/.idx pair is refused here (``check_hint_file_bytes``), not when the
    first sentence it lacks is read."""
    if not MMapIndexedDataset.exists(prefix):
        if not required:
            return None
        raise MissingHintFile(
            f"syntax-hint file not found: {prefix}.bin / {prefix}.idx (make it with "
            f"bet-syntax-hints from the BPE-segmented target text of this split)"
        )
    check_hint_file_bytes(prefix)
    return MMapIndexedDataset(prefix)


# fairseq's mmap index: magic, version (<Q, 1), element type code (<B), sentence count (<Q); then one
# int32 size and one int64 byte offset per sentence. Its .bin is the sentences' elements end to end.
_INDEX_MAGIC = MMapIndexedDataset.Index._HDR_MAGIC
_INDEX_HEADER = struct.Struct(f"<{len(_INDEX_MAGIC)}sQBQ")
_REMAKE = "the pair is truncated or damaged: make it again with bet-syntax-hints"


def check_hint_file_bytes(prefix: str):
    """The .idx holds exactly what its header announces and the .bin exactly what the index points at;
    else a SyntaxHintError naming the file (for a short .bin, the first line it no longer holds)."""
    idx, bin_path = prefix + ".idx", prefix + ".bin"
    idx_size, bin_size = os.path.getsize(idx), os.path.getsize(bin_path)
    with open(idx, "rb") as f:
        header = f.read(_INDEX_HEADER.size)
        if len(header) < _INDEX_HEADER.size:
            raise SyntaxHintError(f"{idx}: {idx_size} bytes, shorter than the {_INDEX_HEADER.size}-byte header "
                                  f"of a fairseq mmap index; {_REMAKE}")
        magic, version, code, n = _INDEX_HEADER.unpack(header)
        if magic != _INDEX_MAGIC or version != 1 or code not in _code_to_dtype:
            raise SyntaxHintError(f"{idx}: not a fairseq mmap index (header {header!r}); {_REMAKE}")
        expected = _INDEX_HEADER.size + n * (4 + 8)
        if idx_size != expected:
            raise SyntaxHintError(
                f"{idx}: {idx_size} bytes, but its header announces {n:,} sentences, which take {expected:,} "
                f"bytes; {_REMAKE}"
            )
        sizes = np.fromfile(f, dtype=np.int32, count=n).astype(np.int64)
        pointers = np.fromfile(f, dtype=np.int64, count=n)
    ends = pointers + sizes * np.dtype(_code_to_dtype[code]).itemsize
    short = np.nonzero(ends > bin_size)[0]
    if len(short):
        i = int(short[0])
        raise SyntaxHintError(
            f"{bin_path}: {bin_size:,} bytes, but line {i + 1} (of {n:,}) ends at byte {int(ends[i]):,} by its "
            f"index {idx}; {_REMAKE}"
        )
    end = int(ends.max()) if n else 0
    if bin_size != end:
        raise SyntaxHintError(
            f"{bin_path}: {bin_size:,} bytes, but its index {idx} accounts for {end:,}: the .bin and .idx are "
            f"not one pair; make it again with bet-syntax-hints"
        )


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
        item[SYNTAX_HINTS] = self._hint_row(index)
        return item

    def collater(self, samples, **kwargs):
        batch = self.dataset.collater(samples, **kwargs)
        if len(samples) == 0 or "net_input" not in batch:
            return batch
        decoder_input = batch["net_input"][self.decoder_input_key]
        by_id = {int(s["id"]): s[SYNTAX_HINTS] for s in samples}
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
        batch[SYNTAX_HINTS] = hints
        return batch
