"""Decoder self-attention variants: one registry, one base class, one file per variant.

A file dropped into this folder that defines a ``SelfAttentionVariant`` subclass decorated with
``register_variant("NAME")`` is imported with the plugin; ``--self-attn-mode NAME`` then selects it on
every bet_fairseq architecture (translation and language model), and its options dataclass, if any,
adds its flags to ``fairseq-train --help`` and to the checkpoint. A variant that also replaces the
encoder self-attention or the encoder-decoder attention says so in its own class (``sites``,
``build_site_attention``). A model resolves its attention once (``resolve_attention``) and hands the
``ModelAttention`` to its layers. See docs/adding_a_variant.md.
"""

import dataclasses
import importlib
import os
from typing import Dict, FrozenSet, Iterable, List, Optional, Type

from fairseq.dataclass import FairseqDataclass
from fairseq.modules.multihead_attention import MultiheadAttention

from ..option_history import OPTION_ADDED
from .base import Attended, SelfAttentionVariant  # noqa: F401
from ..errors import InputError
from .sites import CROSS, DECODER_SELF, ENCODER_SELF, LM_SITES, TRANSLATION_SITES  # noqa: F401

DEFAULT_MODE = "vanilla"  # the Transformer's attention: no --self-attn-mode, and layers outside --self-attn-layers

VARIANTS: Dict[str, Type[SelfAttentionVariant]] = {}


def register_variant(name: str, options: Optional[type] = None):
    """Class decorator: make a ``SelfAttentionVariant`` selectable as ``--self-attn-mode NAME``.

    ``options``: a dataclass (fields with defaults) of this variant's own options; each field becomes
    a flag (``bet_keep_diagonal`` -> ``--bet-keep-diagonal``) stored in the checkpoint. Field names
    are global flags: a name already taken by another variant's options must mean the same field.
    """

    def decorate(cls):
        opts = options
        if not (isinstance(cls, type) and issubclass(cls, SelfAttentionVariant)):
            raise TypeError(f"register_variant({name!r}) decorates a SelfAttentionVariant subclass, got {cls!r}")
        if name in VARIANTS and VARIANTS[name].__qualname__ != cls.__qualname__:
            raise ValueError(f"self-attention variant {name!r} is already registered by {VARIANTS[name].__qualname__}")
        if opts is not None:
            if not dataclasses.is_dataclass(opts):
                raise TypeError(f"register_variant({name!r}, options=...) takes a dataclass, got {opts!r}")
            if not issubclass(opts, FairseqDataclass):  # fairseq's parser and checkpoint need its helpers
                opts = dataclasses.dataclass(type(opts.__name__, (opts, FairseqDataclass), {}))
            _check_option_names(name, opts)
        cls.variant_name = name
        cls.options_class = opts
        VARIANTS[name] = cls
        return cls

    return decorate


def _check_option_names(name, options):
    for other_name, other in VARIANTS.items():
        if other.options_class is None or other_name == name:
            continue
        theirs = {f.name: f for f in option_fields(other.options_class)}
        for f in option_fields(options):
            if f.name in theirs and (theirs[f.name].type, theirs[f.name].default) != (f.type, f.default):
                raise ValueError(f"variant {name!r}: option {f.name!r} is already defined differently by "
                                 f"variant {other_name!r}")


def option_classes() -> List[type]:
    """The distinct options dataclasses of the registered variants, in registration order."""
    seen = []
    for cls in VARIANTS.values():
        if cls.options_class is not None and cls.options_class not in seen:
            seen.append(cls.options_class)
    return seen


def option_fields(options_class) -> List[dataclasses.Field]:
    """The fields of an options dataclass that are flags (not FairseqDataclass's ``_name``)."""
    return [f for f in dataclasses.fields(options_class) if not f.name.startswith("_")]


def _flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def variant_class(args) -> Type[SelfAttentionVariant]:
    """The class ``--self-attn-mode`` names (the Transformer's when unset)."""
    mode = str(_get(args, "self_attn_mode", None) or DEFAULT_MODE)
    if mode not in VARIANTS:
        raise InputError(f"--self-attn-mode: unknown variant {mode!r}; choose one of {', '.join(sorted(VARIANTS))}")
    return VARIANTS[mode]


def variant_options(args):
    """``(variant class, options instance)`` from a model namespace / config, validated.

    Options of *other* variants must stay at their defaults: a flag that would silently do nothing is
    an error naming it.
    """
    cls = variant_class(args)
    own = set() if cls.options_class is None else {f.name for f in option_fields(cls.options_class)}
    for other in option_classes():
        for f in option_fields(other):
            value = _get(args, f.name, None)
            # (a value that option_history fills into a checkpoint saved before the option existed is no error)
            if f.name not in own and value is not None and value != f.default and not (
                    OPTION_ADDED in f.metadata and value == f.metadata[OPTION_ADDED].before):
                users = [n for n, c in VARIANTS.items() if c.options_class is other]
                raise InputError(f"{_flag(f.name)} {value} only applies to --self-attn-mode "
                                 f"{'/'.join(users)} (the mode is {cls.variant_name!r})")
    options = None
    if cls.options_class is not None:
        given = {}
        for f in option_fields(cls.options_class):
            value = _get(args, f.name, None)
            if value is not None:
                given[f.name] = value
        options = cls.options_class(**given)
    return cls, options


@dataclasses.dataclass(frozen=True)
class ModelAttention:
    """A model's attention, resolved once from its options (``resolve_attention``) and handed to its layers,
    which ask it what to build at each of the model's attention sites."""

    variant: Type[SelfAttentionVariant]
    options: Optional[object]  # the variant's options dataclass instance, or None
    model_sites: FrozenSet[str]

    def build(self, site: str, embed_dim: int, num_heads: int, **mha_kwargs) -> Optional[MultiheadAttention]:
        """The attention at ``site``: the variant at DECODER_SELF; elsewhere the variant's own when it
        replaces that site, else None (the layer builds fairseq's)."""
        if site not in self.model_sites:
            raise ValueError(f"attention site {site!r} is not one of this model's: {', '.join(sorted(self.model_sites))}")
        if site == DECODER_SELF:
            return self.variant(embed_dim, num_heads, options=self.options, **mha_kwargs)
        if site not in self.variant.sites:
            return None
        return self.variant.build_site_attention(site, self.options, embed_dim, num_heads, **mha_kwargs)

    @staticmethod
    def build_vanilla_self_attention(embed_dim: int, num_heads: int, **mha_kwargs) -> SelfAttentionVariant:
        """The Transformer's decoder self-attention, for the layers outside ``--self-attn-layers``."""
        return VARIANTS[DEFAULT_MODE](embed_dim, num_heads, **mha_kwargs)


def resolve_attention(args, num_heads: int, model_sites: Iterable[str] = LM_SITES) -> ModelAttention:
    """A model's attention from its options, once, before anything is built (``model_sites``: the attention
    sites the model has). Fills the variant's model-dependent defaults (``model_option_defaults``), fails on
    bad options, then writes the variant's option defaults into ``args``, so that the checkpoint holds them
    (an option declared with ``option_history.option_added`` is filled only into a checkpoint that lacks it, which
    must mean one saved before the option existed)."""
    model_sites = frozenset(model_sites)
    for name, value in variant_class(args).model_option_defaults(model_sites).items():
        if _get(args, name, None) is None:
            setattr(args, name, value)
    cls, options = variant_options(args)
    cls.check_options(options, num_heads)
    if options is not None:
        for f in option_fields(cls.options_class):
            if f.default is not None and _get(args, f.name, None) is None:
                setattr(args, f.name, getattr(options, f.name))
    return ModelAttention(cls, options, model_sites)


def _get(args, name, default):
    try:
        value = getattr(args, name, default)
    except Exception:  # omegaconf raises on a missing key in struct mode
        return default
    return default if value is None else value


def _import_variant_files():
    """Import every module of this folder, so a dropped-in file registers its variant."""
    folder = os.path.dirname(__file__)
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py") and not name.startswith(("_", ".")) and name != "base.py":
            importlib.import_module(f"{__name__}.{name[:-3]}")


_import_variant_files()
