"""The benchmarks run and write sane results: run/bench_gpu.sh --device cpu (bench_lm.py --quick on the tiny
language model, bench_attention.py --sweep at toy sizes), seconds on a CPU."""

import json
import math
import os
import subprocess
import sys

import pytest

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


def test_query_range_benchmark_uses_the_configured_ranges(monkeypatch, capsys):
    """run/bench_query_ranges.py: each ROWSxMOST configuration reaches the kernel as its ranges (64 rows at
    T = 128: 2 ranges; 128 rows: 1), every row of the table is printed, and the default is restored."""
    sys.path.insert(0, os.path.join(ROOT, "run"))
    try:
        import bench_query_ranges
    finally:
        sys.path.pop(0)
    from bet_fairseq.core import kernels

    default = kernels.query_chunks
    seen = []
    kernel = kernels._BetSFCausal.apply
    monkeypatch.setattr(kernels._BetSFCausal, "apply", lambda *a: seen.append(len(a[-1])) or kernel(*a))
    bench_query_ranges.main(["--lengths", "128", "--configs", "64x2,128x2", "--rounds", "1", "--tokens", "256",
                             "--heads", "2", "--head-dim", "8", "--threads", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 128 |")]
    assert [r.split("|")[2].strip() for r in rows] == ["vanilla", "64x2", "128x2"]
    assert seen == [2, 2, 2, 1, 1, 1] * 2  # (warm-up + 1 round) x (64x2: masks, fwd, fwd+bwd; 128x2: the same)
    assert kernels.query_chunks is default


def test_translation_generation_as_fairseq_generate_batches_it(tmp_path):
    """bench_speed.py --generation-only: fairseq-generate's way of generating (sentences in its --batch-size batches,
    sizes a multiple of 8, every hypothesis forced to --forced-len tokens) and batch 1, with every run's figure."""
    out = tmp_path / "speed.json"
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "run", "bench_speed.py"), "--size", "small", "--reps",
                           "1", "--generation-only", "--gen-sentences", "20", "--gen-batch-size", "10",
                           "--latency-sentences", "1", "--forced-len", "3", "--max-tokens", "256", "--threads", "1", "--json",
                           str(out)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    speed = json.loads(out.read_text())
    assert speed["info"]["forced_batches"] == {"generate_forced": [8, 8, 4], "latency": [1]}
    for arch, res in speed["results"].items():
        assert res["train"] == [] and "memory" not in res, arch
        for key in ("generate", "generate_forced", "latency"):
            (value,) = res[key]
            assert value > 0 and math.isfinite(value), (arch, key)
    assert "| batch 1, beam 5, 3 tokens forced, ms per token |" in proc.stdout
    assert "per run, latency (ms per token): " in proc.stdout


def test_study_size_builds_the_study_language_model(tmp_path):
    """bench_lm.py (and bench_speed.py) --size lm_study measures the model bet-reproduce trains at the cpu scale
    (docs/reproduce.md: 3 layers of 128, 4 heads, FFN 512, adaptive softmax with cutoffs 2000 and 10000 over
    WikiText-2's 33,278 words) with the criterion that output layer needs (fairseq's adaptive_loss), for both rows."""
    sys.path.insert(0, os.path.join(ROOT, "run"))
    try:
        import bench_lm
    finally:
        sys.path.pop(0)
    for row in ("vanilla", "bet_sf"):
        folder = tmp_path / row
        folder.mkdir()
        task, trainer = bench_lm.build_lm(row, bench_lm.lm_data_dir(str(folder), 33278), "lm_study", "cpu", 512, 2048)
        decoder = trainer.model.decoder
        assert len(task.target_dictionary) == 33278
        assert len(decoder.layers) == 3 and decoder.embed_dim == 128
        assert decoder.layers[0].fc1.out_features == 512 and decoder.layers[0].self_attn.num_heads == 4
        assert decoder.adaptive_softmax is not None and decoder.adaptive_softmax.cutoff == [2000, 10000, 33278]
        assert type(trainer.criterion).__name__ == "AdaptiveLoss"


def test_bench_speed_hands_both_benchmarks_options_to_the_one_its_size_names(monkeypatch, capsys):
    """bench_speed.py takes the options of both benchmarks (those of the other one have no effect, as before they
    were apart) and runs bench_lm.py's or bench_translation.py's benchmark by --size; each of those refuses the
    other's sizes."""
    sys.path.insert(0, os.path.join(ROOT, "run"))
    try:
        import bench_lm
        import bench_speed
        import bench_translation
    finally:
        sys.path.pop(0)
    calls = []
    monkeypatch.setattr(bench_lm, "benchmark", lambda p, a: calls.append(("lm", a.size, a.block, a.beam)))
    monkeypatch.setattr(bench_translation, "benchmark", lambda p, a: calls.append(("mt", a.size, a.block, a.beam)))
    bench_speed.main(["--size", "lm_study", "--block", "128", "--beam", "3"])
    bench_speed.main(["--size", "small", "--beam", "4", "--new-tokens", "8"])
    bench_speed.main([])
    assert calls == [("lm", "lm_study", "128", 3), ("mt", "small", None, 4), ("mt", "iwslt", None, 5)]
    for module, size in ((bench_lm, "iwslt"), (bench_translation, "lm_tiny")):
        with pytest.raises(SystemExit) as exit_:
            module.main(["--size", size])
        assert exit_.value.code == 2 and f"invalid choice: '{size}'" in capsys.readouterr().err
