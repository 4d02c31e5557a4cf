"""preprocess/prepare_multi30k.py (the demo's and bet-reproduce's Multi30k steps): raw files found with
or without .gz, text lowercased and Moses-tokenised, caps applied, bad input named by file and line."""

import gzip

import pytest

from bet_fairseq.preprocess import common, prepare_multi30k as M


def write_raw(folder, pairs, gz_name=None):
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("train", "val", "test_2016_flickr"):
        for i, lang in enumerate(("de", "en")):
            text = "".join(p[i] + "\n" for p in pairs)
            if name == gz_name:
                with gzip.open(folder / f"{name}.{lang}.gz", "wt", encoding="utf-8") as f:
                    f.write(text)
            else:
                (folder / f"{name}.{lang}").write_text(text, encoding="utf-8")


def test_tokenise_lowercases_splits_punctuation_and_caps(tmp_path):
    raw = tmp_path / "raw"
    write_raw(raw, [("Ein Hund, der läuft.", "A dog, running."), ("Zwei Katzen!", "Two cats!"),
                    ("Drei.", "Three.")], gz_name="val")
    tok = tmp_path / "tok"
    M.tokenise(common.Steps(str(tmp_path / "w")), str(tmp_path), str(tok), max_train=2, max_eval=1)
    assert (tok / "train.de").read_text(encoding="utf-8") == "ein hund , der läuft .\nzwei katzen !\n"
    assert (tok / "train.en").read_text(encoding="utf-8") == "a dog , running .\ntwo cats !\n"
    assert (tok / "valid.en").read_text(encoding="utf-8") == "a dog , running .\n"  # read from val.en.gz
    assert (tok / "test.de").read_text(encoding="utf-8") == "ein hund , der läuft .\n"


def test_missing_and_empty_lines_are_named(tmp_path):
    raw = tmp_path / "raw"
    write_raw(raw, [("Ein Hund.", "A dog."), ("Zwei.", "Two.")])
    (raw / "val.en").unlink()
    with pytest.raises(common.PrepareError, match=r"missing val\.en \(or val\.en\.gz\)"):
        M.tokenise(common.Steps(str(tmp_path / "w")), str(raw), str(tmp_path / "tok"), 0)
    write_raw(raw, [("Ein Hund.", "A dog."), ("Zwei.", "")])
    with pytest.raises(common.PrepareError, match=r"train\.en line 2 is empty"):
        M.tokenise(common.Steps(str(tmp_path / "w2")), str(raw), str(tmp_path / "tok2"), 0)


def test_prepare_refuses_a_data_dir_that_is_not_a_folder(tmp_path):
    with pytest.raises(common.PrepareError, match="is not a folder"):
        M.prepare(str(tmp_path / "w"), str(tmp_path / "nowhere"))
