"""The Hopfield row's library configuration through fairseq's real commands: fairseq-train ->
fairseq-generate (translation) and fairseq-train -> fairseq-eval-lm (language model), with update steps
and their tolerance on; the checkpoint stores the options and rebuilds the LayerNorms."""

import re

import pytest
import torch
from fairseq import checkpoint_utils

from cli_utils import LM_TRAIN, MT_TRAIN, USER_DIR, binarise_multi30k, binarise_wikitext2, eval_lm_in_process, \
    generate_in_process, session_corpus, train_in_process

from bet_fairseq.attention.capture import decoder_self_attentions

FLAGS = ["--hopfield-update-steps-max", "2", "--hopfield-update-steps-eps", "0.001", "--hopfield-heads", "2"]
N_TEST = 37


@pytest.fixture(scope="module")
def mt_data(tmp_path_factory):
    return session_corpus(tmp_path_factory, binarise_multi30k, n_test=N_TEST)


@pytest.fixture(scope="module")
def lm_data(tmp_path_factory):
    return session_corpus(tmp_path_factory, binarise_wikitext2)


def assert_library_checkpoint(path):
    model_cfg = torch.load(path, weights_only=True)["cfg"]["model"]
    stored = {name: model_cfg[name] if isinstance(model_cfg, dict) else getattr(model_cfg, name)
              for name in ("self_attn_mode", "hopfield_config", "hopfield_update_steps_max",
                           "hopfield_update_steps_eps", "hopfield_heads")}
    # the default configuration is stored: a checkpoint without it is one saved before the option existed
    assert stored == dict(self_attn_mode="hopfield", hopfield_config="library", hopfield_update_steps_max=2,
                          hopfield_update_steps_eps=0.001, hopfield_heads=2)
    models, _ = checkpoint_utils.load_model_ensemble([str(path)])
    attentions = decoder_self_attentions(models[0])
    assert len(attentions) == 2
    for a in attentions:
        assert a.options.hopfield_config == "library" and a.num_heads == 2 and a.hopfield_steps == 3
        assert not torch.all(a.norm_stored_pattern.weight == 1), "the LayerNorms were trained and loaded"


def test_translation_train_and_generate(mt_data, tmp_path):
    checkpoint = train_in_process(mt_data, tmp_path / "mt", "--arch", "hopfield_iwslt", *MT_TRAIN, *FLAGS)
    assert_library_checkpoint(checkpoint)
    out = generate_in_process([mt_data, "--user-dir", USER_DIR, "--path", checkpoint, "--beam", "3", "--batch-size",
                               "16", "--max-len-b", "20", "--cpu", "--gen-subset", "test"])
    assert "BLEU4" in out and len(re.findall(r"^H-\d+", out, re.M)) == N_TEST


def test_language_model_train_and_eval_lm(lm_data, tmp_path):
    checkpoint = train_in_process(lm_data, tmp_path / "lm", "--arch", "hopfield_lm", *LM_TRAIN, *FLAGS)
    assert_library_checkpoint(checkpoint)
    result = eval_lm_in_process([lm_data, "--user-dir", USER_DIR, "--path", checkpoint, "--tokens-per-sample", "64",
                                 "--max-tokens", "1024", "--cpu", "--gen-subset", "test"])
    assert 1 < result["perplexity"] < 1e6
