"""run/check_gpu.sh and run/check_gpu.py, the GPU checks of bet_fairseq.hf, and run/bench_hf.py that they call for the
speed ratios: the shell script fails loudly without a CUDA GPU (it never skips); the Python checks pass on CPU in
their dry mode (one family, bfloat16, Dynamo without Inductor) and report a wrong result as a failure; the benchmark's
training and generation runs work at a toy size. The compiled speed runs are left to the GPU script: they are
``torch.compile`` of the models that tests/hf/test_hf_compile.py compiles, and on this CPU each costs tens of
seconds even without Inductor."""

import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "run"))

import bench_hf  # noqa: E402
import check_gpu  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
def test_the_shell_script_fails_loudly_without_a_gpu(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(["bash", os.path.join(ROOT, "run", "check_gpu.sh"), str(tmp_path)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    assert "check_gpu.sh: FAILED: no CUDA GPU visible to torch" in proc.stderr
    assert check_gpu.main(["--device", "cuda"]) == 2


def test_the_checks_pass_in_the_cpu_dry_run(capsys):
    code = check_gpu.main(["--device", "cpu", "--families", "gpt2", "--dtypes", "bfloat16", "--backend", "eager",
                           "--length", "16", "--no-speed"])
    out = capsys.readouterr().out
    assert code == 0, out
    for line in ("ok fused    gpt2", "ok compiled gpt2", "ok static   gpt2", "check_gpu: all checks passed"):
        assert line in out, out


def test_a_wrong_result_fails_the_check(monkeypatch, capsys):
    """A fused path that drifts from the float32 oracle beyond the dtype's tolerance is a failure, exit 1."""
    monkeypatch.setitem(check_gpu.TOLERANCE, torch.bfloat16, 1e-9)
    code = check_gpu.main(["--device", "cpu", "--families", "llama", "--dtypes", "bfloat16", "--no-speed",
                           "--length", "8"])
    assert code == 1
    assert "FAILED llama torch.bfloat16: CheckFailed: llama torch.bfloat16 fused loss" in capsys.readouterr().out


@pytest.mark.parametrize("task,ratio_line", [("train", "bet_sf / stock time"), ("generate", "static / dynamic speed")])
def test_the_benchmark_runs_at_a_toy_size(task, ratio_line, capsys):
    ratio = bench_hf.main(["--task", task, "--family", "qwen3", "--kv-heads", "2", "--layers", "1", "--dim", "32",
                           "--heads", "4", "--vocab", "64", "--batch", "2", "--length", "8", "--new-tokens", "3",
                           "--reps", "2", "--warmup", "0"])
    out = capsys.readouterr().out
    assert ratio > 0 and ratio_line in out and out.count("rep ") == 2, out
