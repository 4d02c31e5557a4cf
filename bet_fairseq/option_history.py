"""Which version added an option, declared beside the option, and the value that keeps the behaviour from before.

An option added after a checkpoint was saved is absent from the checkpoint's stored model configuration, and the
architecture would fill in today's default (say the library configuration of Hopfield) for a model trained with
the earlier behaviour. So each such option declares, in its options dataclass field, the version that added it and
the value that means "as before":

    field(default=..., metadata={"help": ..., **option_added("0.2", before=...)})

On load (the fairseq patch ``compat.upgrade_older_checkpoints``), ``fill_options_added`` sets every declared option
that a bet_fairseq checkpoint's configuration lacks to its ``before`` value; other models' checkpoints are untouched.
No fairseq import at module level: the variant files import this while their package is being loaded.
"""

import argparse
import contextlib
import dataclasses
from typing import Dict, NamedTuple

OPTION_ADDED = "bet_fairseq_option_added"  # the key of an options dataclass field's metadata


class OptionAdded(NamedTuple):
    version: str  # the bet_fairseq version that added the option
    before: object  # the value that means the behaviour from before the option existed


def option_added(version: str, before) -> Dict[str, OptionAdded]:
    """Field metadata of an option that checkpoints saved before ``version`` lack, with the value that
    keeps their behaviour: ``field(default=..., metadata={"help": ..., **option_added("0.2", before=...)})``."""
    return {OPTION_ADDED: OptionAdded(str(version), before)}


def options_added(options_class) -> Dict[str, OptionAdded]:
    """{option name: ``OptionAdded``} of the fields of a dataclass that declare ``option_added``."""
    if options_class is None:
        return {}
    return {f.name: f.metadata[OPTION_ADDED] for f in dataclasses.fields(options_class) if OPTION_ADDED in f.metadata}


def model_options_class(model):
    """The dataclass of a model's options: the one fairseq registered it with, else (a model of fairseq's
    argparse kind) its ``options_dataclass``."""
    return getattr(model, "__dataclass", None) or getattr(model, "options_dataclass", None)


def _get_option(model_cfg, name):
    if isinstance(model_cfg, argparse.Namespace):
        return getattr(model_cfg, name, None)
    return model_cfg.get(name) if name in model_cfg else None


def _bet_fairseq_model(model_cfg):
    """The model class a stored configuration names when bet_fairseq registered it, else None."""
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY

    for key in ("_name", "arch"):
        name = _get_option(model_cfg, key)
        model = ARCH_MODEL_REGISTRY.get(name) or MODEL_REGISTRY.get(name)
        if model is not None:
            return model if model.__module__.startswith("bet_fairseq.") else None
    return None


def fill_options_added(state) -> None:
    """Set, in a loaded checkpoint's model configuration, every option it lacks that its model's options
    dataclass declares with ``option_added``."""
    from omegaconf import OmegaConf, open_dict

    cfg = state.get("cfg")
    model_cfg = cfg.get("model") if cfg is not None else state.get("args")
    model = None if model_cfg is None else _bet_fairseq_model(model_cfg)
    if model is None:
        return
    added = options_added(model_options_class(model))
    if isinstance(model_cfg, argparse.Namespace):
        for name, option in added.items():
            if not hasattr(model_cfg, name):
                setattr(model_cfg, name, option.before)
        return
    with open_dict(model_cfg) if OmegaConf.is_config(model_cfg) else contextlib.nullcontext():
        for name, option in added.items():
            if name not in model_cfg:
                model_cfg[name] = option.before
