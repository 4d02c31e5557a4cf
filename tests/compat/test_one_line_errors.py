"""Every plugin option error is one line on stderr and exit status 2 under fairseq's own commands
(``compat.report_input_errors``), a traceback only for bugs; in process the exception itself still
reaches the caller. Half-precision training without a device for it is one of those errors."""

import os
import subprocess
import sys

import pytest

from cli_utils import BIN, MT_TRAIN, ROOT, USER_DIR, binarise_multi30k, session_corpus, toy_dictionaries, train_in_process

from bet_fairseq import compat, errors
from bet_fairseq.errors import InputError

TINY = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
        "--encoder-ffn-embed-dim", "16", "--decoder-ffn-embed-dim", "16", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2"]


@pytest.fixture(scope="module")
def mt_data(tmp_path_factory):
    return session_corpus(tmp_path_factory, binarise_multi30k)


def run_fresh(*argv):
    """A console script in a fresh process with Python's default warning filters (unlike cli_utils.cli)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    return subprocess.run([os.path.join(BIN, argv[0]), *map(str, argv[1:])], capture_output=True, text=True,
                          env=dict(env, OMP_NUM_THREADS="1"), timeout=300, cwd=ROOT)


def test_an_option_error_under_fairseq_train_is_one_line_and_status_2(tmp_path):
    """Was: exit status 1 and the message as the last line of a 67-line traceback under six hydra warnings."""
    data = toy_dictionaries(tmp_path)
    proc = run_fresh("fairseq-train", data, "--user-dir", USER_DIR, "--task", "translation", "-s", "de", "-t", "en",
                     "--arch", "bet_sf_iwslt", *TINY, "--self-attn-layers", "9-12", "--cpu", "--max-tokens", "100", "--max-update", "1",
                     "--save-dir", tmp_path / "ckpt")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.splitlines() == [
        "fairseq-train: error: --self-attn-layers: '9-12' is outside the decoder's layers 0-1"], proc.stderr


@pytest.mark.parametrize("argv, message", [
    (["--arch", "bet_sf_iwslt", "--self-attn-layers", "9-12"], "--self-attn-layers: '9-12' is outside"),
    (["--arch", "vanilla_iwslt", "--criterion", "label_smoothed_cross_entropy_with_pointer", "--pointer-lambda",
      "nan"], "--pointer-lambda must be a finite number >= 0, got nan"),
    (["--arch", "diag_scale_iwslt", "--diag-scale", "-1"], "--diag-scale must be a finite number >= 0"),
    (["--arch", "bet_sf_iwslt", "--diag-scale", "0.5"], "--diag-scale 0.5 only applies to --self-attn-mode diag_scale"),
    (["--arch", "vanilla_iwslt", "--fp16"], "--fp16 with --cpu: fairseq trains in half precision only on a CUDA GPU"),
    (["--arch", "vanilla_iwslt", "--bf16"], "--bf16: fairseq 0.12 trains bfloat16 only on a TPU"),
], ids=["layers", "pointer_lambda_nan", "diag_scale_negative", "option_of_another_variant", "fp16", "bf16"])
def test_plugin_option_errors_are_input_errors(mt_data, tmp_path, argv, message):
    """In process the caller gets the InputError itself (a ValueError); at the top of a command it is one line."""
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        train_in_process(mt_data, tmp_path, *MT_TRAIN, *argv, updates=1)


def test_half_precision_needs_a_device(monkeypatch):
    """Was: AssertionError 'Torch not compiled with CUDA enabled' (--fp16) and "'NoneType' object has no
    attribute 'xla_device'" (--bf16, which fairseq 0.12 turns into --tpu) from inside fairseq's trainer."""
    import importlib.util
    from types import SimpleNamespace

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for flag in ("fp16", "amp", "memory_efficient_fp16"):
        problem = compat.half_precision_problem(SimpleNamespace(**{flag: True}, cpu=False))
        assert problem.startswith(f"--{flag.replace('_', '-')}: fairseq trains in half precision only on a CUDA GPU")
    assert compat.half_precision_problem(SimpleNamespace(fp16=False, cpu=True)) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert compat.half_precision_problem(SimpleNamespace(fp16=True, cpu=False)) is None
    if importlib.util.find_spec("torch_xla") is None:
        assert "only on a TPU" in compat.half_precision_problem(SimpleNamespace(bf16=True, tpu=True, cpu=False))


def test_the_hook_handles_input_errors_only(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["fairseq-generate", "data"])
    with pytest.raises(SystemExit) as stop:
        errors.excepthook(InputError, InputError("a.pt: damaged\nsecond line"), None)
    assert stop.value.code == 2
    assert capsys.readouterr().err == "fairseq-generate: error: a.pt: damaged; second line\n"
    seen = []
    errors.excepthook(KeyError, KeyError("bug"), None, lambda *a: seen.append(a[1]))
    assert [str(e) for e in seen] == ["'bug'"]  # a bug keeps its traceback (the previous hook)


def test_the_hook_is_installed_once():
    compat.report_input_errors()
    compat.report_input_errors()
    assert getattr(sys.excepthook, "_bet_reports_input_errors", False)
    assert not getattr(sys.excepthook.__closure__[0].cell_contents, "_bet_reports_input_errors", False)
