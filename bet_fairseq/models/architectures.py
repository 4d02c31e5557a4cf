"""Every architecture: the catalog's rows times its sizes, named by its one rule (``catalog.arch_name``).

An architecture only fills options the command line left unset, so ``--self-attn-mode NAME`` (any
registered variant) and its options work on every one of them. The names of version 0.1
(``transformer_iwslt_de_en_reduced_diag``, ``transformer_lm_wikitext2``, ``bet_vanilla_iwslt`` ...)
stay registered as aliases (``catalog.legacy_arch_names``). The models call ``translation_defaults`` /
``lm_defaults`` themselves; this module only registers.
"""

from fairseq.models import register_model_architecture
from fairseq.models import transformer as fairseq_transformer

from .. import catalog
from . import transformer, transformer_lm  # noqa: F401  (the models the architectures are registered for)
from .defaults import apply_lm_size, fill, lm_defaults, translation_defaults
from ..errors import InputError


def _row_settings(args, arch_name, row: catalog.Row):
    for option in row.needs:
        if getattr(args, option, None) is None:
            raise InputError(f"--arch {arch_name} needs --{option.replace('_', '-')} C (C > 0)")
    fill(args, **row.attention)


def _row_layers(args, row: catalog.Row):
    if row.layers is not None:
        fill(args, self_attn_layers=row.layers(args.decoder_layers))


def _architecture(arch_name, row: catalog.Row, size: catalog.Size):
    def architecture(args):
        _row_settings(args, arch_name, row)
        if size.kind == "mt":
            getattr(fairseq_transformer, size.fairseq_sizes)(args)
            translation_defaults(args)
        else:
            apply_lm_size(args, size)
            lm_defaults(args)
        _row_layers(args, row)

    architecture.__name__ = arch_name
    architecture.__doc__ = f"{row.label} at the {size.suffix} size ({size.fairseq_sizes or size.dims})"
    return architecture


MODEL_OF_KIND = {"mt": "bet_transformer", "lm": "bet_transformer_lm"}


def _register_all():
    table = catalog.arch_names()
    entries = list(table.items()) + [(old, table[new]) for old, new in catalog.legacy_arch_names().items()]
    for name, (row, size) in entries:
        if not row.own_model:
            register_model_architecture(MODEL_OF_KIND[size.kind], name)(_architecture(name, row, size))
    register_model_architecture("bet_transformer", "bet_transformer")(translation_defaults)
    register_model_architecture("baseline_transformer", "baseline_transformer")(translation_defaults)


_register_all()
