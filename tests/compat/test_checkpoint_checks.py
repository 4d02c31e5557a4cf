"""Damaged checkpoints are refused when loaded, naming the file (``bet_fairseq.checkpoints``): an empty
file, a file that is not a checkpoint, a byte flipped inside the weights (the digest saved with every
checkpoint), NaN weights in a checkpoint without a digest. Before: EOFError, KeyError: 101, and the
damaged weights loaded silently."""

import os
import shutil
import subprocess
import zipfile

import pytest
import torch
from fairseq import checkpoint_utils

from cli_utils import BIN, MT_TRAIN, ROOT, USER_DIR, binarise_multi30k, session_corpus, train_in_process

from bet_fairseq import checkpoints
from bet_fairseq.checkpoints import DIGEST_KEY, CheckpointError


@pytest.fixture(scope="module")
def mt_data(tmp_path_factory):
    return session_corpus(tmp_path_factory, binarise_multi30k)


@pytest.fixture(scope="module")
def saved(mt_data, tmp_path_factory):
    return train_in_process(mt_data, tmp_path_factory.mktemp("ckpt"), "--arch", "bet_sf_iwslt", *MT_TRAIN, updates=2)


def load(path):
    return checkpoint_utils.load_checkpoint_to_cpu(str(path))


def copy(saved, tmp_path, name="damaged.pt"):
    return shutil.copy(saved, tmp_path / name)


def test_a_saved_checkpoint_carries_the_digest_of_its_model(saved):
    raw = torch.load(saved, weights_only=True)
    assert raw["extra_state"][DIGEST_KEY] == checkpoints.model_digest(raw["model"])
    assert load(saved)["model"].keys() == raw["model"].keys()  # and loads


def test_an_empty_file_is_named(tmp_path):
    path = tmp_path / "checkpoint_best.pt"
    path.write_bytes(b"")
    with pytest.raises(CheckpointError, match=f"{path}: the checkpoint file is empty"):
        load(path)


def test_a_file_that_is_not_a_checkpoint_is_named(tmp_path):
    path = tmp_path / "notes.pt"
    path.write_text("hello\n")
    with pytest.raises(CheckpointError, match=f"{path}: not a readable checkpoint"):
        load(path)
    other = tmp_path / "weights.pt"
    torch.save({"weight": torch.zeros(2)}, other)  # a torch file, not a fairseq checkpoint
    with pytest.raises(CheckpointError, match=f"{other}: not a fairseq checkpoint \\(no 'model' state"):
        load(other)


def flip_a_weight_byte(path, name_part="embed_tokens"):
    """Flip the low byte of the first float of a model tensor's storage inside the zip (still finite)."""
    state = torch.load(path, weights_only=True)
    weight = next(v for k, v in state["model"].items() if name_part in k)
    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if "/data/" in i.filename and i.file_size == weight.numel() * 4)
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
        f.seek(info.header_offset + 30 + name_len + extra_len)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 1]))


def test_a_flipped_byte_in_the_weights_is_caught_by_the_digest(saved, tmp_path):
    path = copy(saved, tmp_path)
    flip_a_weight_byte(path)
    raw = torch.load(path, weights_only=True)  # torch itself reads it without complaint
    assert all(torch.isfinite(t).all() for t in raw["model"].values() if t.is_floating_point())
    with pytest.raises(CheckpointError, match=f"{path}: its weights differ from the digest recorded"):
        load(path)


def test_nan_weights_without_a_digest_are_named(saved, tmp_path):
    state = torch.load(saved, weights_only=False)
    del state["extra_state"][DIGEST_KEY]  # a checkpoint of another tool or of version 0.1
    name = next(k for k in state["model"] if "embed_tokens" in k)
    state["model"][name].view(-1)[:100] = float("nan")
    path = tmp_path / "nan.pt"
    torch.save(state, path)
    with pytest.raises(CheckpointError, match=f"{path}: 100 of .* values of {name} are NaN or infinite"):
        load(path)


def test_fairseq_generate_names_the_damaged_checkpoint_in_one_line(mt_data, saved, tmp_path):
    """Was: the damaged weights loaded and beam search ran on them (exit 0)."""
    path = copy(saved, tmp_path)
    flip_a_weight_byte(path)
    proc = subprocess.run([os.path.join(BIN, "fairseq-generate"), mt_data, "--user-dir", USER_DIR, "--path", path,
                           "--cpu", "--beam", "1", "--max-len-b", "3", "--batch-size", "8"],
                          capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[-1].startswith(f"fairseq-generate: error: {path}: its weights differ")
    assert "Traceback" not in proc.stderr
