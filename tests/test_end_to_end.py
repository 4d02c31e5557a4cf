"""fairseq-preprocess -> fairseq-train -> fairseq-generate / fairseq-eval-lm through the real CLIs."""

import re

import pytest
import torch

from cli_utils import (
    COMMON_TRAIN, TINY_LM, TINY_TRANSLATION, USER_DIR, binarise_multi30k, binarise_wikitext2, cli, cli_in_process,
)

import bet_fairseq  # noqa: F401  (registers the architectures listed below)
from fairseq.models import ARCH_MODEL_REGISTRY

TRANSLATION_ARCHS = sorted(a for a, m in ARCH_MODEL_REGISTRY.items() if m.__name__ == "BirdEyeTransformerModel")
LM_ARCHS = sorted(a for a, m in ARCH_MODEL_REGISTRY.items() if m.__name__ == "BirdEyeTransformerLanguageModel")


def extra_flags(arch):
    return ["--diag-scale", "0.5"] if arch.endswith("_diag_scale") else []


@pytest.fixture(scope="module")
def mt_data(tmp_path_factory):
    # 37 test sentences: not a multiple of fairseq's --required-batch-size-multiple (8), whose last
    # batch fairseq-fixed drops unless bet_fairseq.fairseq_compat keeps it.
    return binarise_multi30k(str(tmp_path_factory.mktemp("mt")), n_test=37)


@pytest.fixture(scope="module")
def lm_data(tmp_path_factory):
    return binarise_wikitext2(str(tmp_path_factory.mktemp("lm")))


def train_mt(data, arch, save_dir, updates=3, *flags):
    return cli("fairseq-train", data, "--user-dir", USER_DIR, "--arch", arch, *TINY_TRANSLATION,
               *COMMON_TRAIN, "--max-tokens", "1500", "--max-update", updates, "--save-dir", save_dir,
               "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
               *extra_flags(arch), *flags)


def train_lm(data, arch, save_dir, updates=3, *flags):
    return cli("fairseq-train", data, "--task", "language_modeling", "--user-dir", USER_DIR, "--arch", arch,
               *TINY_LM, *COMMON_TRAIN, "--tokens-per-sample", "64", "--max-tokens", "1024",
               "--max-update", updates, "--save-dir", save_dir, *extra_flags(arch), *flags)


@pytest.mark.parametrize("arch", ["bet_sf_iwslt", "transformer_iwslt_de_en_diagfree"])
def test_translation_train_generate(mt_data, tmp_path, arch):
    save = tmp_path / "ckpt"
    log = train_mt(mt_data, arch, save, 4).stdout
    losses = [float(x) for x in re.findall(r"\| loss ([\d.]+)", log)]
    assert losses, log[-2000:]
    ckpt = save / "checkpoint_last.pt"
    state = torch.load(ckpt, weights_only=True)  # torch's safe unpickler, with our allow-list
    assert state["cfg"]["model"].self_attn_mode == ("bet_sf" if arch.startswith("bet") else "diag_free")
    out = cli("fairseq-generate", mt_data, "--user-dir", USER_DIR, "--path", ckpt, "--beam", "3",
              "--batch-size", "16", "--max-len-b", "20", "--cpu", "--gen-subset", "test").stdout
    assert "BLEU4" in out
    assert len(re.findall(r"^H-\d+", out, re.M)) == 37, "every test sentence is translated"


def hypotheses(generate_output):
    return {int(i): (float(score), hyp) for i, score, hyp in re.findall(r"^H-(\d+)\t(\S+)\t(.*)$", generate_output, re.M)}


def test_beam_search_batched_equals_one_at_a_time(mt_data, tmp_path):
    """Beam search reorders the BET cache (K, V and R) between steps; a batch of 20 sentences with
    beam 4 must give the hypotheses that each sentence gets alone."""
    save = tmp_path / "ckpt"
    train_mt(mt_data, "bet_sf_iwslt", save, 2)
    runs = {}
    for bsz in (1, 20):
        runs[bsz] = hypotheses(cli(
            "fairseq-generate", mt_data, "--user-dir", USER_DIR, "--path", save / "checkpoint_last.pt",
            "--beam", "4", "--batch-size", bsz, "--max-len-b", "15", "--cpu", "--gen-subset", "test",
            "--num-workers", "0").stdout)
    assert len(runs[1]) == 37 and runs[1].keys() == runs[20].keys()
    for i in runs[1]:
        assert runs[1][i][1] == runs[20][i][1], i
        assert abs(runs[1][i][0] - runs[20][i][0]) < 1e-3
    assert len({h for _, h in runs[1].values()}) > 1, "degenerate model: every hypothesis is the same"


def test_lm_train_eval(lm_data, tmp_path):
    save = tmp_path / "ckpt"
    train_lm(lm_data, "bet_sf_lm", save, 4)
    out = cli("fairseq-eval-lm", lm_data, "--user-dir", USER_DIR, "--path", save / "checkpoint_last.pt",
              "--tokens-per-sample", "64", "--max-tokens", "1024", "--cpu", "--gen-subset", "test")
    text = out.stdout + out.stderr
    ppl = float(re.search(r"Perplexity: ([\d.]+)", text).group(1))
    assert 1 < ppl < 1e6


def test_every_architecture_trains(mt_data, lm_data, tmp_path):
    """Each registered architecture builds from its name and takes two updates (in one process
    per family, through fairseq_cli.train's real main, to keep the suite fast)."""
    from fairseq_cli import train as train_cli

    def run(argv):
        cli_in_process(train_cli, argv)

    for arch in TRANSLATION_ARCHS:
        save = tmp_path / arch
        run([mt_data, "--user-dir", USER_DIR, "--arch", arch, *TINY_TRANSLATION, *COMMON_TRAIN,
             "--max-tokens", "1000", "--max-update", "2", "--save-dir", save, "--no-save",
             *extra_flags(arch)])
    for arch in LM_ARCHS:
        save = tmp_path / arch
        run([lm_data, "--task", "language_modeling", "--user-dir", USER_DIR, "--arch", arch, *TINY_LM,
             *COMMON_TRAIN, "--tokens-per-sample", "32", "--max-tokens", "512", "--max-update", "2",
             "--save-dir", save, "--no-save", *extra_flags(arch)])


def test_options_reach_help_and_checkpoint(mt_data):
    out = cli("fairseq-train", mt_data, "--user-dir", USER_DIR, "--arch", "bet_sf_iwslt", "--help").stdout
    for flag in ("--self-attn-mode", "--diag-scale", "--bet-keep-diagonal", "--bet-share-w"):
        assert flag in out, flag


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--self-attn-mode", "bogus"], "invalid choice: 'bogus'"),
        (["--self-attn-mode", "diag_scale", "--diag-scale", "0"], "--diag-scale must be a finite number > 0"),
        (["--self-attn-mode", "diag_scale", "--diag-scale", "-2"], "--diag-scale must be a finite number > 0"),
    ],
)
def test_bad_options_are_clear_errors(mt_data, tmp_path, flags, message):
    proc = cli(
        "fairseq-train", mt_data, "--user-dir", USER_DIR, "--arch", "bet_vanilla_iwslt", *TINY_TRANSLATION,
        *COMMON_TRAIN, "--max-tokens", "1000", "--max-update", "1", "--save-dir", tmp_path, *flags, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr[-2000:]


def test_checkpoint_from_other_arch_is_a_clear_error(mt_data, tmp_path):
    vanilla = tmp_path / "vanilla"
    train_mt(mt_data, "transformer_iwslt_de_en", vanilla, 1)
    proc = cli("fairseq-train", mt_data, "--user-dir", USER_DIR, "--arch", "bet_sf_iwslt", *TINY_TRANSLATION,
               *COMMON_TRAIN, "--max-tokens", "1000", "--max-update", "2", "--save-dir", tmp_path / "bet",
               "--finetune-from-model", vanilla / "checkpoint_last.pt", check=False)
    assert proc.returncode != 0
    assert "not trained with --self-attn-mode bet_sf" in proc.stderr, proc.stderr[-2000:]
