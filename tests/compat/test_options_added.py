"""Patch 6: an option added after a checkpoint was saved gets, on load, the value that keeps the behaviour
the checkpoint was trained with, as its options dataclass field declares it (``option_history.option_added`` in the
field's metadata); other models' checkpoints and options they store are left alone."""

import argparse
import dataclasses
import os

import pytest
from fairseq import checkpoint_utils
from omegaconf import OmegaConf

from bet_fairseq import option_history
from bet_fairseq.models.transformer import VariantTransformerModel
from bet_fairseq.models.transformer_lm import VariantTransformerLanguageModel

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "legacy_v0_1")


@dataclasses.dataclass
class ProbeOptions:
    """Options of a later version than the fixtures: one they lack, one they store."""

    probe_option_added_later: str = dataclasses.field(
        default="today", metadata={"help": "probe", **option_history.option_added("9.9", before="before")})
    routing_clusters: int = dataclasses.field(default=16, metadata=option_history.option_added("9.9", before=999))


@pytest.fixture
def probe_options(monkeypatch):
    """The probe as the options dataclass of both kinds of model: fairseq's registered dataclass (the
    language models) and the argparse translation model's ``options_dataclass``."""
    monkeypatch.setattr(VariantTransformerLanguageModel, "__dataclass", ProbeOptions)
    monkeypatch.setattr(VariantTransformerModel, "options_dataclass", ProbeOptions)


def test_a_missing_option_gets_the_value_its_field_declares(probe_options):
    state = checkpoint_utils.load_checkpoint_to_cpu(os.path.join(FIXTURES, "routing_lm.pt"))
    assert state["cfg"]["model"]["probe_option_added_later"] == "before"
    assert state["cfg"]["model"]["routing_clusters"] == 3  # stored in the checkpoint: kept
    state = checkpoint_utils.load_checkpoint_to_cpu(os.path.join(FIXTURES, "bet_sf_iwslt.pt"))  # a Namespace
    assert state["cfg"]["model"].probe_option_added_later == "before"


def test_version_0_1_checkpoints_get_the_declared_values_of_todays_options():
    """The real declarations, beside each option (models/options.py and the variant files)."""
    lm = checkpoint_utils.load_checkpoint_to_cpu(os.path.join(FIXTURES, "routing_lm.pt"))["cfg"]["model"]
    assert (lm["routing_separate_qk"], lm["routing_commitment"], lm["self_attn_layers"]) == (True, 0.0, "all")
    assert lm["hopfield_config"] == "attention" and lm["sparse_topk_attention"] == "ds"
    mt = checkpoint_utils.load_checkpoint_to_cpu(os.path.join(FIXTURES, "localness_iwslt.pt"))["cfg"]["model"]
    assert (mt.localness_centre_scale, mt.self_attn_layers, mt.sparse_topk_attention) == ("i+1", "all", "ds")


def test_the_declarations_are_read_from_the_fields():
    added = option_history.options_added(ProbeOptions)
    assert added == {"probe_option_added_later": option_history.OptionAdded("9.9", "before"),
                     "routing_clusters": option_history.OptionAdded("9.9", 999)}
    assert option_history.options_added(None) == {}
    from bet_fairseq.models.options import AttentionConfig

    todays = option_history.options_added(AttentionConfig)
    assert {name: o.before for name, o in todays.items()} == {
        "self_attn_layers": "all", "hopfield_config": "attention", "localness_centre_scale": "i+1",
        "routing_separate_qk": True, "routing_commitment": 0.0, "sparse_topk_attention": "ds"}
    assert {o.version for o in todays.values()} == {"0.2"}


def test_other_models_are_untouched(probe_options):
    theirs = {"cfg": {"model": OmegaConf.create({"_name": "transformer_lm"})}}
    option_history.fill_options_added(theirs)
    assert "probe_option_added_later" not in theirs["cfg"]["model"]
    old_style = {"args": argparse.Namespace(arch="transformer_iwslt_de_en")}
    option_history.fill_options_added(old_style)
    assert not hasattr(old_style["args"], "probe_option_added_later")
    ours = {"args": argparse.Namespace(arch="bet_sf_iwslt")}
    option_history.fill_options_added(ours)
    assert ours["args"].probe_option_added_later == "before"
