"""The bet-prepare-* commands on small real slices of ../shared/data, checked against independent facts:
the Moses-tokenised Multi30k release (tokenisation + lowercasing), the IWSLT14 recipe's own BPE output
(apply_bpe), the raw bytes of enwik8 (byte tokens), token counts of the text (binarised sizes)."""

import collections
import os

import pytest

from cli_utils import require_shared

from bet_fairseq.preprocess import prepare_enwik8, prepare_iwslt14, prepare_wikitext, prepare_wmt17
from bet_fairseq.preprocess.common import PrepareError, apply_bpe, binarised_lengths

N_TRAIN = 300
SEGS = 8


def lines_of(path):
    with open(path, encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


def write(path, lines):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(l + "\n" for l in lines))


def unbpe(line):
    return (line + " ").replace("@@ ", "").rstrip(" ")


def mtimes(folder):
    out = {}
    for dirpath, _, files in os.walk(folder):
        for name in files:
            p = os.path.join(dirpath, name)
            out[p] = os.stat(p).st_mtime_ns
    return out


HEADER = ["<url>http://www.ted.com/talks/a_talk.html</url>", "<keywords>talks, science</keywords>",
          "<talkid>42</talkid>", "<title>Talk Title</title>", "<description>Talk Title</description>"]


def fake_iwslt_release(root):
    """An IWSLT14 de-en release made of Multi30k raw text: train.tags with the tag lines the recipe drops,
    and IWSLT14.TED*.xml files whose <seg> lines hold Multi30k validation sentences."""
    raw = require_shared("multi30k", "raw")
    folder = os.path.join(root, "de-en")
    chunk_of = {}
    for lang in ("de", "en"):
        train = lines_of(os.path.join(raw, f"train.{lang}"))[:N_TRAIN]
        write(os.path.join(folder, f"train.tags.de-en.{lang}"), HEADER + train[:150] + HEADER + train[150:])
        val = lines_of(os.path.join(raw, f"val.{lang}"))
        # chunk k of val goes to the k-th name in ALPHABETICAL order, so the test concatenation order matters
        for k, name in enumerate(sorted(prepare_iwslt14.TEST_SETS)):
            chunk_of[name] = k
            segs = "".join(f'<seg id="{i + 1}"> {s} </seg>\n' for i, s in enumerate(val[k * SEGS:(k + 1) * SEGS]))
            text = (f'<?xml version="1.0" encoding="UTF-8"?>\n<mteval>\n<srcset setid="iwslt" srclang="{lang}">\n'
                    f'<doc docid="1" genre="lectures">\n<talkid>1</talkid>\n{segs}</doc>\n</srcset>\n</mteval>\n')
            with open(os.path.join(folder, f"{name}.de-en.{lang}.xml"), "w", encoding="utf-8") as f:
                f.write(text)
    return root, chunk_of


def test_iwslt14_recipe(tmp_path):
    raw, chunk_of = fake_iwslt_release(str(tmp_path / "raw"))
    out = str(tmp_path / "out")
    summary = prepare_iwslt14.main(["--raw-dir", raw, "--out-dir", out, "--bpe-merges", "200"])
    tok = require_shared("multi30k", "tok")

    # train: the tag lines are gone, title/description text kept (the recipe's sed), Moses tokens, lowercased,
    # cleaned with ratio 1.5; compared with the Multi30k release's own lowercased Moses tokens.
    ref = {l: lines_of(os.path.join(tok, f"train.lc.norm.tok.{l}"))[:N_TRAIN] for l in ("de", "en")}
    head = [("talk title", "talk title")] * 2  # the <title> and <description> lines of each header
    data = list(zip(ref["de"], ref["en"]))
    ref_pairs = head + data[:150] + head + data[150:]
    kept = [(d, e) for d, e in ref_pairs if max(len(d.split()), len(e.split())) / min(len(d.split()), len(e.split())) <= 1.5]
    full = list(zip(*(lines_of(os.path.join(out, "tmp", f"train.tags.de-en.{l}")) for l in ("de", "en"))))
    assert len(full) == len(kept)
    assert sum(a == b for a, b in zip(full, kept)) >= 0.97 * len(full)
    assert not any("<url>" in d or "&lt; url" in d or "42" == d for d, _ in full)

    # valid = every 23rd line, train = the rest; BPE is lossless; test = the recipe's concatenation order
    for lang, i in (("de", 0), ("en", 1)):
        col = [p[i] for p in full]
        assert [unbpe(l) for l in lines_of(os.path.join(out, f"valid.{lang}"))] == col[22::23]
        assert [unbpe(l) for l in lines_of(os.path.join(out, f"train.{lang}"))] == [x for n, x in enumerate(col, 1) if n % 23]
        val_tok = lines_of(os.path.join(tok, f"val.lc.norm.tok.{lang}"))
        expected = [s for name in prepare_iwslt14.TEST_SETS
                    for s in val_tok[chunk_of[name] * SEGS:(chunk_of[name] + 1) * SEGS]]
        got = [unbpe(l) for l in lines_of(os.path.join(out, f"test.{lang}"))]
        assert len(got) == 5 * SEGS
        assert sum(a == b for a, b in zip(got, expected)) >= len(got) - 2
    assert summary["pairs"] == {"train": len(full) - len(full) // 23, "valid": len(full) // 23, "test": 5 * SEGS}

    # joint BPE codes learnt (header + 200 merges) and a joined dictionary
    codes = lines_of(os.path.join(out, "code"))
    assert codes[0].startswith("#version") and len(codes) == 201
    bin_dir = os.path.join(out, "bin")
    assert open(os.path.join(bin_dir, "dict.de.txt")).read() == open(os.path.join(bin_dir, "dict.en.txt")).read()
    for split in ("train", "valid", "test"):
        for lang in ("de", "en"):
            sizes = binarised_lengths(bin_dir, split, lang, "de", "en")
            assert list(sizes) == [len(l.split()) + 1 for l in lines_of(os.path.join(out, f"{split}.{lang}"))]

    # re-running is a no-op: every output keeps its mtime
    before = mtimes(out)
    prepare_iwslt14.main(["--raw-dir", raw, "--out-dir", out, "--bpe-merges", "200"])
    after = mtimes(out)
    assert {p: t for p, t in after.items() if p in before and not p.endswith("summary.json")} == \
        {p: t for p, t in before.items() if not p.endswith("summary.json")}


def test_iwslt14_bad_inputs(tmp_path, capsys):
    raw, _ = fake_iwslt_release(str(tmp_path / "raw"))
    en = os.path.join(raw, "de-en", "train.tags.de-en.en")
    lines = lines_of(en)
    write(en, lines[:-5])  # truncated English side
    with pytest.raises(PrepareError, match=r"train\.tags\.de-en\.de has \d+ lines.*train\.tags\.de-en\.en has"):
        prepare_iwslt14.main(["--raw-dir", raw, "--out-dir", str(tmp_path / "o1"), "--bpe-merges", "50"])
    write(en, lines)
    xml = os.path.join(raw, "de-en", "IWSLT14.TED.tst2011.de-en.de.xml")
    text = open(xml, encoding="utf-8").read()
    with open(xml, "w", encoding="utf-8") as f:
        f.write(text[: len(text) // 2])  # download cut in the middle
    with pytest.raises(PrepareError, match=r"IWSLT14\.TED\.tst2011\.de-en\.de\.xml, line \d+"):
        prepare_iwslt14.main(["--raw-dir", raw, "--out-dir", str(tmp_path / "o2"), "--bpe-merges", "50"])
    assert not os.path.exists(str(tmp_path / "o2" / "bin"))
    os.makedirs(tmp_path / "empty")
    with pytest.raises(PrepareError, match="no train.tags.de-en.de or de-en.tgz"):
        prepare_iwslt14.main(["--raw-dir", str(tmp_path / "empty"), "--out-dir", str(tmp_path / "o3")])


def test_apply_bpe_reproduces_the_recipe(tmp_path):
    """Our apply step with the recipe's own codes gives the recipe's own BPE text, line for line."""
    folder = require_shared("iwslt14-de-en")
    for lang in ("de", "en"):
        src = tmp_path / f"in.{lang}"
        write(str(src), lines_of(os.path.join(folder, "tok_lc_nobpe", f"valid.{lang}"))[:400])
        apply_bpe(os.path.join(folder, "code"), str(src), str(tmp_path / f"out.{lang}"))
        assert lines_of(str(tmp_path / f"out.{lang}")) == lines_of(os.path.join(folder, f"valid.{lang}"))[:400]


def fake_wmt_release(root, n_train=300, n_valid=30, n_test=40):
    raw = require_shared("multi30k", "raw")

    def sgm(path, lines, kind):
        segs = "".join(f'<seg id="{i + 1}">{s}</seg>\n' for i, s in enumerate(lines))
        write(path, [f'<{kind} setid="newstest" srclang="any">', '<doc docid="d1" genre="news">', segs.rstrip("\n"),
                     "</doc>", f"</{kind}>"])

    for lang in ("en", "de"):
        write(os.path.join(root, f"europarl-v7.de-en.{lang}"), lines_of(os.path.join(raw, f"train.{lang}"))[:n_train])
        role = "src" if lang == "en" else "ref"
        kind = "srcset" if lang == "en" else "refset"
        sgm(os.path.join(root, "dev", f"newstest2016-ende-{role}.{lang}.sgm"),
            lines_of(os.path.join(raw, f"val.{lang}"))[:n_valid], kind)
        sgm(os.path.join(root, "test", f"newstest2017-ende-{role}.{lang}.sgm"),
            lines_of(os.path.join(raw, f"test_2016_flickr.{lang}"))[:n_test], kind)
    return root


def test_wmt17(tmp_path):
    raw = fake_wmt_release(str(tmp_path / "raw"))
    out = str(tmp_path / "out")
    with pytest.raises(PrepareError, match=r"newstest2017-ende-src\.en\.sgm has 40 segments, newstest2017 has 3,004"):
        prepare_wmt17.main(["--raw-dir", raw, "--out-dir", out, "--bpe-merges", "300"])
    summary = prepare_wmt17.main(["--raw-dir", raw, "--out-dir", out, "--bpe-merges", "300", "--no-size-check"])
    assert summary["pairs"]["test"] == 40  # the test set is not cleaned
    assert 25 <= summary["pairs"]["valid"] <= 30 and 280 <= summary["pairs"]["train"] <= 300
    train_de = [unbpe(l) for l in lines_of(os.path.join(out, "train.de"))]
    assert any(c.isupper() for l in train_de for c in l)  # WMT stays cased
    assert any(" @-@ " in l for l in train_de)  # aggressive hyphen splitting (tokenizer.perl -a)
    assert not any("<seg" in l for l in lines_of(os.path.join(out, "test.en")))
    bin_dir = os.path.join(out, "bin")
    for split in ("train", "valid", "test"):
        sizes = binarised_lengths(bin_dir, split, "de", "en", "de")
        assert list(sizes) == [len(l.split()) + 1 for l in lines_of(os.path.join(out, f"{split}.de"))]
    # a misaligned corpus is named
    de = os.path.join(raw, "europarl-v7.de-en.de")
    write(de, lines_of(de)[:-1])
    with pytest.raises(PrepareError, match=r"europarl-v7\.de-en\.en has 300 lines.*europarl-v7\.de-en\.de has 299"):
        prepare_wmt17.main(["--raw-dir", raw, "--out-dir", out, "--no-size-check"])


def test_wikitext(tmp_path, capsys):
    folder = require_shared("wikitext-2")
    valid, test = lines_of(os.path.join(folder, "valid.txt")), lines_of(os.path.join(folder, "test.txt"))
    raw = tmp_path / "wikitext-2"
    write(str(raw / "wiki.train.tokens"), valid[:300])
    write(str(raw / "wiki.valid.tokens"), valid[300:400])
    write(str(raw / "wiki.test.tokens"), test[:200])
    out = str(tmp_path / "out")
    with pytest.raises(PrepareError, match=r"wiki\.train\.tokens has 300 lines, the wikitext-2 train file has 36,718"):
        prepare_wikitext.main(["--raw-dir", str(raw), "--out-dir", out])
    summary = prepare_wikitext.main(["--raw-dir", str(raw), "--out-dir", out, "--no-size-check"])
    bin_dir = os.path.join(out, "bin")
    counts = collections.Counter(w for l in valid[:300] for w in l.split())
    with open(os.path.join(bin_dir, "dict.txt"), encoding="utf-8") as f:
        dictionary = {w: int(c) for w, c in (l.split(" ")[:2] for l in f.read().splitlines())
                      if not w.startswith("madeupword")}  # fairseq's padding to a multiple of 8
    assert dictionary == {w: c for w, c in counts.items() if w != "<unk>"}  # <unk> is fairseq's special
    assert summary["text"]["train"] == {"lines": 300, "tokens": sum(counts.values())}
    for split, lines in (("train", valid[:300]), ("valid", valid[300:400]), ("test", test[:200])):
        assert list(binarised_lengths(bin_dir, split)) == [len(l.split()) + 1 for l in lines]
    capsys.readouterr()
    before = mtimes(bin_dir)
    prepare_wikitext.main(["--raw-dir", str(raw), "--out-dir", out, "--no-size-check"])
    assert "[binarise] skipping" in capsys.readouterr().err and mtimes(bin_dir) == before
    # truncated in the middle of a line
    text = (raw / "wiki.test.tokens").read_bytes()
    cut = text[: len(text) - 37]
    assert not cut.endswith(b"\n")
    (raw / "wiki.test.tokens").write_bytes(cut)
    last = cut.count(b"\n") + 1
    with pytest.raises(PrepareError, match=rf"wiki\.test\.tokens, line {last}: the file ends in the middle of a line"):
        prepare_wikitext.main(["--raw-dir", str(raw), "--out-dir", out, "--no-size-check"])
    assert mtimes(bin_dir) == before  # the finished outputs are untouched


def test_enwik8(tmp_path):
    src = require_shared("enwik8", "enwik8_small")
    data = open(src, "rb").read()
    out = str(tmp_path / "out")
    with pytest.raises(PrepareError, match=r"1,071,051 bytes, enwik8 has 100,000,000"):
        prepare_enwik8.main(["--input", src, "--out-dir", out])
    data = data[:300000]  # the first 300 kB of enwik8_small keep the test short
    small = tmp_path / "enwik8"
    small.write_bytes(data)
    summary = prepare_enwik8.main(["--raw-dir", str(tmp_path), "--out-dir", out, "--valid-bytes", "50000",
                                   "--test-bytes", "50000"])
    parts = {"train": data[:-100000], "valid": data[-100000:-50000], "test": data[-50000:]}
    for split, part in parts.items():
        with open(os.path.join(out, f"{split}.txt"), encoding="ascii") as f:
            text = f.read()
        rebuilt = bytes(10 if t == "\n" else int(t) for t in text.replace("\n", " \n ").split(" ") if t)
        assert rebuilt == part  # every byte is one token, the newline a line break
        sizes = binarised_lengths(os.path.join(out, "bin"), split)
        assert len(sizes) == part.count(b"\n") + (0 if part.endswith(b"\n") else 1)
        assert int(sizes.sum()) == len(part) + (0 if part.endswith(b"\n") else 1)
    with open(os.path.join(out, "bin", "dict.txt")) as f:
        symbols = {l.split()[0] for l in f.read().splitlines() if not l.startswith("madeupword")}
        assert symbols == {str(b) for b in set(parts["train"]) - {10}}
    assert summary["bytes"] == {"train": len(data) - 100000, "valid": 50000, "test": 50000}
    # a truncated zip is named
    bad = tmp_path / "enwik8.zip"
    import zipfile

    with zipfile.ZipFile(bad, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("enwik8", data[:20000])
    bad.write_bytes(bad.read_bytes()[:3000])
    with pytest.raises(PrepareError, match=r"enwik8\.zip: corrupt or truncated zip"):
        prepare_enwik8.main(["--input", str(bad), "--out-dir", str(tmp_path / "o2"), "--valid-bytes", "10"])


def test_download_without_network_is_a_clear_error(tmp_path, monkeypatch):
    import urllib.request

    def offline(*a, **k):
        raise OSError("Network is unreachable")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(PrepareError, match=r"could not download enwik8\.zip: http://mattmahoney\.net/dc/enwik8\.zip: "
                       r"OSError: Network is unreachable\. .*--raw-dir"):
        prepare_enwik8.main(["--out-dir", str(tmp_path)])
    orig = os.path.join(tmp_path, "orig")
    assert not os.path.isdir(orig) or not os.listdir(orig)  # nothing half-downloaded left behind


def test_atomic_outputs_never_leave_a_half_written_file(tmp_path):
    """bet_fairseq.files: what every step, result and picture of the project is written through."""
    from bet_fairseq.files import atomic_path, atomic_write

    path = tmp_path / "out" / "result.json"
    with atomic_write(str(path)) as f:
        f.write("old\n")
    with pytest.raises(RuntimeError):
        with atomic_write(str(path)) as f:
            f.write("half of the new")
            raise RuntimeError("interrupted")
    assert path.read_text() == "old\n" and os.listdir(path.parent) == ["result.json"]
    with pytest.raises(ValueError, match="result.json.*mode 'a'"):
        atomic_write(str(path), "a").__enter__()

    # a tool that writes the file itself sees the real extension (matplotlib picks the format by it)
    with atomic_path(str(tmp_path / "loss.png")) as tmp:
        assert tmp.endswith(".png") and os.path.dirname(tmp) == str(tmp_path)
        with open(tmp, "wb") as f:
            f.write(b"png")
    assert (tmp_path / "loss.png").read_bytes() == b"png"

    # a folder (fairseq-preprocess --destdir) replaces the old folder as a whole
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "old.idx").write_text("x")
    with atomic_path(str(tmp_path / "bin")) as tmp:
        os.makedirs(tmp)
        with open(os.path.join(tmp, "new.idx"), "w") as f:
            f.write("y")
    assert os.listdir(tmp_path / "bin") == ["new.idx"]

    # a .bin/.idx pair: both or nothing
    prefix = str(tmp_path / "pair" / "train.hints.en")
    with atomic_path(prefix, suffixes=(".bin", ".idx")) as tmp:
        for suffix in (".bin", ".idx"):
            with open(tmp + suffix, "w") as f:
                f.write("1" + suffix)
    with pytest.raises(FileNotFoundError, match=r"train\.hints\.en.*\.idx was not written"):
        with atomic_path(prefix, suffixes=(".bin", ".idx")) as tmp:
            with open(tmp + ".bin", "w") as f:
                f.write("2.bin")
    assert sorted(os.listdir(tmp_path / "pair")) == ["train.hints.en.bin", "train.hints.en.idx"]
    assert open(prefix + ".bin").read() == "1.bin" and open(prefix + ".idx").read() == "1.idx"
