"""The benchmarks run and write sane results: run/bench_gpu.sh --device cpu (bench_speed.py --quick on the tiny
language model, bench_attention.py --sweep at toy sizes), seconds on a CPU."""

import json
import math
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_gpu_script_runs_on_cpu(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    proc = subprocess.run(["bash", os.path.join(ROOT, "run", "bench_gpu.sh"), str(tmp_path), "--device", "cpu"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]

    speed = json.loads((tmp_path / "speed_lm_tiny.json").read_text())
    assert speed["info"]["blocks"] == [128] and speed["info"]["reps"] == 1
    assert speed["info"]["archs"] == ["vanilla_lm_enwik8", "bet_sf_lm_enwik8"]
    for row in ("vanilla", "bet_sf"):
        for key in ("train", "eval_lm", "sample"):
            (value,) = speed["results"]["128"][row][key]
            assert value > 0 and math.isfinite(value), (row, key, value)
    ratios = speed["median_ratios"]["128"]
    for key in ("train", "eval_lm", "sample"):
        want = speed["medians"]["128"]["bet_sf"][key] / speed["medians"]["128"]["vanilla"][key]
        assert math.isclose(ratios[key], want), key
    table = (tmp_path / "speed_lm_tiny.md").read_text()
    assert "| 128 | training, tokens/s |" in table and "| 128 | eval-lm" in table and "| 128 | sampling" in table

    sweep = json.loads((tmp_path / "attention_sweep.json").read_text())
    got = {(r["dtype"], r["T"], r["module"]) for r in sweep["rows"]}
    assert got == {(d, t, m) for d in ("float32", "bfloat16") for t in (32, 64) for m in ("vanilla", "bet_sf")}
    assert all(r["fwd_bwd_ms"] >= r["forward_ms"] > 0 and r["peak_mb"] is None for r in sweep["rows"])
    assert "| bfloat16 | 64 |" in (tmp_path / "attention_sweep.md").read_text()
