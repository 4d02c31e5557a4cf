"""Patch 6: an option added after a checkpoint was saved gets, on load, the value that keeps the behaviour
the checkpoint was trained with; other models' checkpoints and options they store are left alone."""

import argparse
import os

from fairseq import checkpoint_utils
from omegaconf import OmegaConf

from bet_fairseq import compat

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "legacy_v0_1")


def test_a_missing_option_gets_its_earlier_value(monkeypatch):
    monkeypatch.setitem(compat.OPTIONS_ADDED, "probe_option_added_later", "before")
    monkeypatch.setitem(compat.OPTIONS_ADDED, "routing_clusters", 999)  # stored in the checkpoint: kept
    state = checkpoint_utils.load_checkpoint_to_cpu(os.path.join(FIXTURES, "routing_lm.pt"))
    assert state["cfg"]["model"]["probe_option_added_later"] == "before"
    assert state["cfg"]["model"]["routing_clusters"] == 3
    state = checkpoint_utils.load_checkpoint_to_cpu(os.path.join(FIXTURES, "bet_sf_iwslt.pt"))  # a Namespace
    assert state["cfg"]["model"].probe_option_added_later == "before"


def test_other_models_are_untouched(monkeypatch):
    monkeypatch.setitem(compat.OPTIONS_ADDED, "probe_option_added_later", "before")
    theirs = {"cfg": {"model": OmegaConf.create({"_name": "transformer_lm"})}}
    compat.fill_options_added(theirs)
    assert "probe_option_added_later" not in theirs["cfg"]["model"]
    old_style = {"args": argparse.Namespace(arch="transformer_iwslt_de_en")}
    compat.fill_options_added(old_style)
    assert not hasattr(old_style["args"], "probe_option_added_later")
    ours = {"args": argparse.Namespace(arch="bet_sf_iwslt")}
    compat.fill_options_added(ours)
    assert ours["args"].probe_option_added_later == "before"
