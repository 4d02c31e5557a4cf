"""Every architecture: one table of sizes times one table of variants, one naming scheme.

``{row}_{size}``: ``row`` a key of ``ROWS`` (the decoder self-attention of a Table 2 row), ``size`` one
of ``iwslt``, ``wmt_en_de`` (translation: fairseq's transformer_iwslt_de_en / transformer_wmt_en_de
sizes) or ``lm``, ``lm_wikitext103``, ``lm_enwik8`` (language models at the sizes of ``LM_SIZES``).
An architecture only fills options the command line left unset, so ``--self-attn-mode NAME`` (any
registered variant) and its options work on every one of them. The names of version 0.1
(``transformer_iwslt_de_en_reduced_diag``, ``transformer_lm_wikitext2``, ``bet_vanilla_iwslt`` ...)
stay registered as aliases (``LEGACY_ALIASES``).
"""

from fairseq.models import register_model_architecture
from fairseq.models.transformer import transformer_iwslt_de_en, transformer_wmt_en_de
from fairseq.models.transformer_lm import base_lm_architecture
from fairseq.utils import safe_getattr

from . import transformer, transformer_lm  # noqa: F401  (the models the table registers for)
from ..errors import InputError

# row -> the attention options it sets (the rows of the paper's Table 2).
ROWS = {
    "vanilla": dict(self_attn_mode="vanilla"),
    "bet_sf": dict(self_attn_mode="bet_sf"),
    "bet_sf_nodiagmask": dict(self_attn_mode="bet_sf", bet_keep_diagonal=True),
    "bet_sg": dict(self_attn_mode="vanilla"),  # BET(SG) changes the loss only (the pointer criterion)
    "reduced_diag": dict(self_attn_mode="diag_scale", diag_scale=0.2),
    "magnified_diag": dict(self_attn_mode="diag_scale", diag_scale=2.0),
    "diag_scale": dict(self_attn_mode="diag_scale"),  # needs --diag-scale C
    "diagfree": dict(self_attn_mode="diag_free"),
    "localness": dict(self_attn_mode="localness"),
    "sparse_topk": dict(self_attn_mode="sparse_topk"),
    "hopfield": dict(self_attn_mode="hopfield"),
    "routing": dict(self_attn_mode="routing"),
}
# row -> the decoder layers it uses its attention in, by the number of layers (default: all).
# Yang et al. 2018 found localness best in the lower layers (1-3 of 6): the lower half.
ROW_LAYERS = {"localness": lambda layers: f"0-{max(layers // 2, 1) - 1}"}
TRANSLATION_SIZES = {"iwslt": transformer_iwslt_de_en, "wmt_en_de": transformer_wmt_en_de}
# Language models (the paper's LM settings and the authors' code), 6 layers, post-norm as the paper's.
# WikiText-103 takes 6 heads: the authors' 8 do not divide 300.
LM_SIZES = {
    "wikitext2": dict(decoder_embed_dim=300, decoder_ffn_embed_dim=1200, decoder_attention_heads=4),
    "wikitext103": dict(decoder_embed_dim=300, decoder_ffn_embed_dim=1200, decoder_attention_heads=6),
    "enwik8": dict(decoder_embed_dim=512, decoder_ffn_embed_dim=2048, decoder_attention_heads=4),
}
LM_SIZE_SUFFIX = {"wikitext2": "lm", "wikitext103": "lm_wikitext103", "enwik8": "lm_enwik8"}


def fill(args, **defaults):
    """Set each option the command line (or checkpoint) left unset."""
    for name, value in defaults.items():
        if safe_getattr(args, name, None) is None:
            setattr(args, name, value)


def translation_defaults(args):
    fill(args, self_attn_mode="vanilla")
    transformer_wmt_en_de(args)


def apply_lm_size(args, size):
    fill(args, **LM_SIZES[size], decoder_layers=6)


def lm_defaults(args):
    """fairseq's ``base_lm_architecture``, except that it does not force pre-norm: the paper's layers
    (its equations 2-3) and the authors' code are post-norm, and fairseq's flag
    ``--decoder-normalize-before`` keeps its meaning (pre-norm when given). Checkpoints saved while
    fairseq forced it store ``decoder_normalize_before=True`` and so stay pre-norm."""
    fill(args, self_attn_mode="vanilla")
    normalize_before = safe_getattr(args, "decoder_normalize_before", False)
    base_lm_architecture(args)
    args.decoder_normalize_before = bool(normalize_before)


def _row_settings(args, arch_name, row):
    if row == "diag_scale" and safe_getattr(args, "diag_scale", None) is None:
        raise InputError(f"--arch {arch_name} needs --diag-scale C (C > 0)")
    fill(args, **ROWS[row])


def _row_layers(args, row):
    if row in ROW_LAYERS:
        fill(args, self_attn_layers=ROW_LAYERS[row](args.decoder_layers))


def _translation_arch(arch_name, row, size_fn):
    def architecture(args):
        _row_settings(args, arch_name, row)
        size_fn(args)
        translation_defaults(args)
        _row_layers(args, row)

    architecture.__doc__ = f"{size_fn.__name__} sizes, decoder self-attention {ROWS[row]}"
    return architecture


def _lm_arch(arch_name, row, size):
    def architecture(args):
        _row_settings(args, arch_name, row)
        apply_lm_size(args, size)
        lm_defaults(args)
        _row_layers(args, row)

    architecture.__doc__ = f"{size} LM sizes, self-attention {ROWS[row]}"
    return architecture


def arch_names():
    """{architecture name: (model name, row, size)} of the table, canonical names only."""
    names = {}
    for row in ROWS:
        for size in TRANSLATION_SIZES:
            names[f"{row}_{size}"] = ("bet_transformer", row, size)
        for size, suffix in LM_SIZE_SUFFIX.items():
            names[f"{row}_{suffix}"] = ("bet_transformer_lm", row, size)
    return names


def legacy_aliases():
    """{version 0.1 name: canonical name}."""
    aliases = {}
    for size, fairseq_size in (("iwslt", "iwslt_de_en"), ("wmt_en_de", "wmt_en_de")):
        aliases[f"bet_vanilla_{size}"] = f"vanilla_{size}"
        for row in ("reduced_diag", "magnified_diag", "diag_scale", "diagfree"):
            aliases[f"transformer_{fairseq_size}_{row}"] = f"{row}_{size}"
    for size, suffix in LM_SIZE_SUFFIX.items():
        aliases[f"transformer_lm_{size}"] = f"vanilla_{suffix}"
        for row in ("reduced_diag", "magnified_diag", "diag_scale", "diagfree"):
            aliases[f"transformer_lm_{size}_{row}"] = f"{row}_{suffix}"
    return aliases


def _register_all():
    table = arch_names()
    entries = list(table.items()) + [(old, table[new]) for old, new in legacy_aliases().items()]
    for name, (model, row, size) in entries:
        if model == "bet_transformer":
            fn = _translation_arch(name, row, TRANSLATION_SIZES[size])
        else:
            fn = _lm_arch(name, row, size)
        fn.__name__ = name
        register_model_architecture(model, name)(fn)
    register_model_architecture("bet_transformer", "bet_transformer")(translation_defaults)
    register_model_architecture("baseline_transformer", "baseline_transformer")(translation_defaults)


_register_all()
