"""docs/adding_a_variant.md, done as a user would: its variant file dropped into a copy of the package's
``attention/`` folder, nothing else changed, then the real fairseq-train, fairseq-generate and
fairseq-eval-lm (subprocesses, so the copy is imported fresh through ``--user-dir``)."""

import os
import random
import re
import shutil

import pytest
import torch

from cli_utils import ROOT, cli, cli_in_process

DOC = os.path.join(ROOT, "docs", "adding_a_variant.md")
TINY_MT = ("--encoder-layers 1 --decoder-layers 2 --encoder-embed-dim 16 --decoder-embed-dim 16 "
           "--encoder-ffn-embed-dim 32 --decoder-ffn-embed-dim 32 --encoder-attention-heads 2 "
           "--decoder-attention-heads 2").split()
TINY_LM = "--decoder-layers 2 --decoder-embed-dim 16 --decoder-ffn-embed-dim 32 --decoder-attention-heads 2".split()
TRAIN = "--optimizer adam --lr 0.005 --cpu --max-update 4 --no-epoch-checkpoints --log-format simple --seed 1".split()


def variant_file_from_doc() -> str:
    """The code blocks of the guide marked ``<!-- test:variant-file -->``, in order: the file a user saves."""
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    blocks = re.findall(r"<!-- test:variant-file -->\n```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 3, "docs/adding_a_variant.md lost a marked code block"
    return "\n\n".join(blocks)


@pytest.fixture(scope="module")
def plugin_copy(tmp_path_factory):
    """A copy of the package with the guide's file dropped into attention/ (the only change)."""
    parent = tmp_path_factory.mktemp("plugin")
    dest = parent / "bet_fairseq"
    shutil.copytree(os.path.join(ROOT, "bet_fairseq"), dest, ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "attention" / "toy_half_temperature.py").write_text(variant_file_from_doc(), encoding="utf-8")
    return str(dest)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Random-word corpora, binarised for translation and for language modelling."""
    root = tmp_path_factory.mktemp("data")
    rng = random.Random(0)

    def lines(n):
        return "".join(" ".join(f"w{rng.randrange(30)}" for _ in range(rng.randint(3, 10))) + "\n" for _ in range(n))

    for split, n in (("train", 60), ("valid", 12)):
        for lang in ("de", "en"):
            (root / f"{split}.{lang}").write_text(lines(n))
        (root / f"{split}.txt").write_text(lines(n))
    from fairseq_cli import preprocess

    cli_in_process(preprocess, ["--source-lang", "de", "--target-lang", "en", "--trainpref", root / "train",
                                "--validpref", root / "valid", "--destdir", root / "mt", "--joined-dictionary",
                                "--workers", "1"])
    cli_in_process(preprocess, ["--only-source", "--trainpref", root / "train.txt", "--validpref",
                                root / "valid.txt", "--destdir", root / "lm", "--workers", "1"])
    return root


def test_help_lists_the_new_option(plugin_copy):
    out = cli("fairseq-train", "--user-dir", plugin_copy, "--arch", "vanilla_iwslt", "--help").stdout
    assert "--toy-temperature" in out and "toy_half_temperature" in out


def test_translation_trains_and_generates(plugin_copy, data, tmp_path):
    """The guide's variant that also replaces the encoder-decoder attention (tests/models/test_variant_sites.py
    checks that such a module is built where the variant says)."""
    cli("fairseq-train", data / "mt", "--user-dir", plugin_copy, "--arch", "vanilla_iwslt", "--self-attn-mode",
        "toy_half_temperature_everywhere", *TINY_MT, *TRAIN, "--max-tokens", "300", "--save-dir", tmp_path)
    state = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert state["cfg"]["model"].self_attn_mode == "toy_half_temperature_everywhere"
    out = cli("fairseq-generate", data / "mt", "--user-dir", plugin_copy, "--path", tmp_path / "checkpoint_last.pt",
              "--gen-subset", "valid", "--beam", "3", "--batch-size", "5", "--cpu").stdout
    assert len(re.findall(r"^H-\d+", out, flags=re.M)) == 12  # every valid sentence, beam search in batches


def test_language_model_with_an_option_trains_and_evaluates(plugin_copy, data, tmp_path):
    cli("fairseq-train", data / "lm", "--user-dir", plugin_copy, "--task", "language_modeling", "--arch",
        "transformer_lm_wikitext2", "--self-attn-mode", "toy_temperature", "--toy-temperature", "4", *TINY_LM,
        *TRAIN, "--tokens-per-sample", "16", "--max-tokens", "128", "--sample-break-mode", "none",
        "--save-dir", tmp_path)
    model_cfg = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu", weights_only=False)["cfg"]["model"]
    assert (model_cfg["self_attn_mode"], model_cfg["toy_temperature"]) == ("toy_temperature", 4.0)
    out = cli("fairseq-eval-lm", data / "lm", "--user-dir", plugin_copy, "--path", tmp_path / "checkpoint_last.pt",
              "--gen-subset", "valid", "--tokens-per-sample", "16", "--cpu")
    ppl = re.search(r"Perplexity: ([0-9.]+)", out.stdout + out.stderr)
    assert ppl and 1.0 < float(ppl.group(1)) < 1e4


def test_a_bad_option_value_fails_before_training(plugin_copy, data, tmp_path):
    proc = cli("fairseq-train", data / "mt", "--user-dir", plugin_copy, "--arch", "vanilla_iwslt", "--self-attn-mode",
               "toy_temperature", "--toy-temperature", "-1", *TINY_MT, *TRAIN, "--max-tokens", "300",
               "--save-dir", tmp_path, check=False)
    assert proc.returncode != 0 and "--toy-temperature must be > 0" in proc.stderr
    assert not os.path.exists(tmp_path / "checkpoint_last.pt")
