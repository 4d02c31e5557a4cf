"""fairseq-train -> fairseq-generate / fairseq-eval-lm through fairseq's real command-line code, for every
registered variant on a generic architecture (``--self-attn-mode NAME``); every architecture name builds;
bad options and a checkpoint of another variant are clear errors. The runs are in process (the commands'
own ``cli_main`` / ``main``); one test runs the installed console scripts in fresh processes."""

import re

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.models import ARCH_MODEL_REGISTRY, FairseqLanguageModel

from cli_utils import (
    LM_TRAIN, MT_TRAIN, NO_WORKERS, TINY_LM, TINY_TRANSLATION, USER_DIR, VARIANT_FLAGS, binarise_multi30k,
    binarise_wikitext2, build_model, cli, eval_lm_in_process, generate_in_process, session_corpus, toy_dictionaries,
    train_in_process, variant_flags,
)

from bet_fairseq.attention import VARIANTS
from bet_fairseq.errors import InputError
from bet_fairseq.attention.relative import RelativeSelfAttention
from bet_fairseq import catalog
from bet_fairseq.attention.capture import decoder_self_attentions
from bet_fairseq.models.transformer_xl_lm import TransformerXLLanguageModel

ARCHS = sorted(a for a, m in ARCH_MODEL_REGISTRY.items() if m.__module__.startswith("bet_fairseq."))
N_TEST = 37  # not a multiple of --required-batch-size-multiple (8): fairseq-fixed drops the last batch
# unless bet_fairseq.compat keeps it, so every test sentence must come back


@pytest.fixture(scope="module")
def mt_data(tmp_path_factory):
    return session_corpus(tmp_path_factory, binarise_multi30k, n_test=N_TEST)


@pytest.fixture(scope="module")
def lm_data(tmp_path_factory):
    return session_corpus(tmp_path_factory, binarise_wikitext2)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, mt_data, lm_data):
    """``trained(kind, variant)``: checkpoint_last.pt of 3 updates of ``--arch vanilla_iwslt`` (kind "mt") or
    ``--arch transformer_lm_wikitext2`` (kind "lm") with ``--self-attn-mode variant``, trained once."""
    folder = tmp_path_factory.mktemp("checkpoints")
    done = {}

    def checkpoint(kind, variant):
        if (kind, variant) not in done:
            data, arch, flags = ((mt_data, "vanilla_iwslt", MT_TRAIN) if kind == "mt"
                                 else (lm_data, "transformer_lm_wikitext2", LM_TRAIN))
            done[kind, variant] = train_in_process(data, folder / f"{kind}_{variant}", "--arch", arch, *flags,
                                                   *variant_flags(variant))
        return done[kind, variant]

    return checkpoint


def option(cfg, name):
    return cfg[name] if isinstance(cfg, dict) else getattr(cfg, name)


def assert_checkpoint_holds(path, variant):
    """The checkpoint (read by torch's safe unpickler, with bet_fairseq.compat's allow-list) stores the
    variant and its options, and loads as a model of that variant."""
    state = torch.load(path, weights_only=True)
    model_cfg = state["cfg"]["model"]
    flags = VARIANT_FLAGS.get(variant, [])
    given = {flag[2:].replace("-", "_"): value for flag, value in zip(flags[::2], flags[1::2])}
    assert option(model_cfg, "self_attn_mode") == variant
    assert {name: str(option(model_cfg, name)) for name in given} == given
    models, _ = checkpoint_utils.load_model_ensemble([str(path)])
    attentions = decoder_self_attentions(models[0])
    assert len(attentions) == 2 and all(type(a) is VARIANTS[variant] for a in attentions)
    assert all({name: str(getattr(a.options, name)) for name in given} == given for a in attentions)
    return state


def translate(data, checkpoint, *flags):
    return generate_in_process([data, "--user-dir", USER_DIR, "--path", checkpoint, "--beam", "3", "--batch-size", "16",
                                "--max-len-b", "20", "--cpu", "--gen-subset", "test", *flags])


def assert_every_sentence_translated(generate_output):
    assert "BLEU4" in generate_output
    assert len(re.findall(r"^H-\d+", generate_output, re.M)) == N_TEST, "every test sentence is translated"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_translation_train_and_generate(mt_data, trained, variant):
    checkpoint = trained("mt", variant)
    assert_checkpoint_holds(checkpoint, variant)
    assert_every_sentence_translated(translate(mt_data, checkpoint))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_language_model_train_and_eval_lm(lm_data, trained, variant):
    checkpoint = trained("lm", variant)
    state = assert_checkpoint_holds(checkpoint, variant)
    if variant == "routing":  # the centroids are saved, initialised by the first training batch
        assert state["model"]["decoder.layers.0.self_attn.centroids"].shape == (2, 3, 8)
        assert bool(state["model"]["decoder.layers.0.self_attn.centroids_initialized"])
    result = eval_lm_in_process([lm_data, "--user-dir", USER_DIR, "--path", checkpoint, "--tokens-per-sample", "64",
                                 "--max-tokens", "1024", "--cpu", "--gen-subset", "test"])
    assert 1 < result["perplexity"] < 1e6


def test_the_console_scripts(mt_data, tmp_path):
    """The installed commands in fresh processes, where only --user-dir imports the plugin: an architecture
    of the table trains, and fairseq-generate loads its checkpoint and translates every test sentence.
    (fairseq-eval-lm's main runs in process above; its console script imports the plugin the same way.)"""
    save = tmp_path / "ckpt"
    log = cli("fairseq-train", mt_data, "--user-dir", USER_DIR, "--arch", "bet_sf_iwslt", *MT_TRAIN,
              "--max-update", "3", "--save-dir", save).stdout
    assert re.findall(r"\| loss ([\d.]+)", log), log[-2000:]
    assert_checkpoint_holds(save / "checkpoint_last.pt", "bet_sf")
    out = cli("fairseq-generate", mt_data, "--user-dir", USER_DIR, "--path", save / "checkpoint_last.pt", "--beam", "3",
              "--batch-size", "16", "--max-len-b", "20", "--cpu", "--gen-subset", "test", *NO_WORKERS).stdout
    assert_every_sentence_translated(out)


# ---------------------------------------------------------------- every architecture name
@pytest.fixture(scope="module")
def dicts(tmp_path_factory):
    return toy_dictionaries(tmp_path_factory.mktemp("dicts"))


def row_of(arch):
    """The Table 2 row an architecture name stands for (None: a model name, whose default it takes)."""
    row = catalog.row_of_arch(arch)
    return row.key if row else None


@pytest.mark.parametrize("arch", ARCHS)
def test_every_architecture_name_builds(dicts, arch):
    """Each registered name builds (tiny sizes) with the self-attention and options of its row."""
    model_class = ARCH_MODEL_REGISTRY[arch]
    given = ["--diag-scale", "0.5"] if "diag_scale" in arch else []
    if issubclass(model_class, TransformerXLLanguageModel):
        task = ["--task", "bet_truncated_bptt_lm", "--batch-size", "2", *TINY_LM]
    elif issubclass(model_class, FairseqLanguageModel):
        task = ["--task", "language_modeling", *TINY_LM]
    else:
        task = ["--task", "translation", "-s", "de", "-t", "en", *TINY_TRANSLATION]
    model, _, _ = build_model([dicts, *task, "--arch", arch, *given])
    if issubclass(model_class, TransformerXLLanguageModel):
        assert all(type(layer.self_attn) is RelativeSelfAttention for layer in model.decoder.layers)
        return
    row = row_of(arch)
    settings = dict(catalog.row(row).attention, **({"diag_scale": 0.5} if row == "diag_scale" else {})) if row else {}
    mode = settings.pop("self_attn_mode", "routing" if arch == "bet_routing_lm" else "vanilla")
    attentions = decoder_self_attentions(model)
    layers = [0] if row == "localness" else [0, 1]  # localness: the lower half of the 2 layers
    assert [a.variant_name for a in attentions] == [mode if i in layers else "vanilla" for i in range(2)]
    attentions = [attentions[i] for i in layers]
    assert all(getattr(a.options, name) == value for a in attentions for name, value in settings.items())


# ---------------------------------------------------------------- errors
def messages(error):
    """The messages of an exception and of those it was raised from or while handling."""
    found = []
    while error is not None:
        found.append(str(error))
        error = error.__cause__ or error.__context__
    return "\n".join(found)


@pytest.mark.parametrize("argv, message", [
    (["--arch", "vanilla_iwslt", "--self-attn-mode", "bogus"],
     "--self-attn-mode: unknown variant 'bogus'; choose one of bet_sf, diag_free, diag_scale, hopfield"),
    (["--arch", "vanilla_iwslt", "--self-attn-mode", "diag_scale", "--diag-scale", "nan"],
     "--diag-scale must be a finite number >= 0"),
    (["--arch", "reduced_diag_iwslt", "--diag-scale", "-2"], "--diag-scale must be a finite number >= 0"),
    (["--arch", "diag_scale_iwslt"], "--arch diag_scale_iwslt needs --diag-scale C"),
    (["--arch", "hopfield_iwslt", "--hopfield-beta", "0"], "--hopfield-beta must be a finite number > 0"),
    (["--arch", "sparse_topk_iwslt", "--sparse-topk", "0"], "--sparse-topk must be a whole number >= 1"),
    (["--arch", "localness_iwslt", "--sparse-topk", "4"],
     "--sparse-topk 4 only applies to --self-attn-mode sparse_topk (the mode is 'localness')"),
    (["--arch", "vanilla_iwslt", "--self-attn-mode", "routing", "--routing-heads", "9"],
     "--routing-heads must be an integer between 0 and the number of heads (4)"),
    (["--arch", "bet_sf_iwslt", "--self-attn-baseline", "hopfield"],
     "--self-attn-baseline hopfield and --self-attn-mode bet_sf disagree"),
], ids=["unknown_mode", "diag_scale_nan", "diag_scale_negative", "diag_scale_missing", "hopfield_beta", "sparse_topk",
        "option_of_another_variant", "routing_heads", "legacy_option_disagrees"])
def test_bad_options_are_clear_errors(mt_data, tmp_path, argv, message):
    """InputErrors: one line and exit status 2 at the top of the command (tests/compat/test_one_line_errors.py)."""
    with pytest.raises(InputError) as error:
        train_in_process(mt_data, tmp_path, *MT_TRAIN, *argv, updates=1)
    assert message in str(error.value)


def test_checkpoint_of_another_variant_is_a_clear_error(mt_data, trained, tmp_path):
    """fairseq-train --finetune-from-model (fairseq re-raises with its own message) and fairseq-generate with
    the mode overridden: the error names the parameter the two variants do not share."""
    with pytest.raises(Exception) as error:
        train_in_process(mt_data, tmp_path, "--arch", "bet_sf_iwslt", *MT_TRAIN,
                         "--finetune-from-model", trained("mt", "vanilla"), updates=1)
    assert ("checkpoint has no decoder.layers.0.self_attn.bet_w, which a 'bet_sf' self-attention needs"
            in messages(error.value))
    with pytest.raises(ValueError, match=re.escape(
            "checkpoint holds decoder.layers.0.self_attn.bet_w, which a 'hopfield' self-attention does not have")):
        translate(mt_data, trained("mt", "bet_sf"), "--model-overrides", "{'self_attn_mode': 'hopfield'}")
