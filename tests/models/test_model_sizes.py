"""Whole models built from their --arch names, counted by hand: what each variant adds to fairseq's own
transformer (and nothing else: the encoder and the encoder-decoder attention stay fairseq's), and the
sizes and attention settings every architecture name carries."""

import math
from argparse import Namespace

import pytest
from fairseq.models import ARCH_CONFIG_REGISTRY
from fairseq.modules.multihead_attention import MultiheadAttention

from cli_utils import TINY_LM, TINY_TRANSLATION, build_model, n_params, toy_dictionaries, variant_flags

from bet_fairseq.attention import VARIANTS
from bet_fairseq.attention.sparse_topk import SparseTopKAttention
from bet_fairseq import catalog
from bet_fairseq.attention.capture import decoder_self_attentions

MT = ["--task", "translation", "-s", "de", "-t", "en"]
LM = ["--task", "language_modeling"]
E, H, LAYERS = 32, 4, 2  # the TINY_* sizes
D = E // H


@pytest.fixture(scope="module")
def dicts(tmp_path_factory):
    return toy_dictionaries(tmp_path_factory.mktemp("dicts"))


def build(dicts, task, arch, *flags):
    return build_model([dicts, *task, "--arch", arch, *flags])[0]


def shapes(model):
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


# Per decoder layer, by hand: the parameters a variant adds to fairseq's MultiheadAttention (E = 32, 4
# heads), and the buffers (saved in the checkpoint, never trained by gradient).
ADDED_PARAMETERS = {
    "vanilla": {},
    "diag_scale": {},
    "diag_free": {},
    "sparse_topk": {},
    # the library configuration (the default): affine LayerNorms on the state pattern, stored pattern and
    # pattern projection inputs
    "hopfield": {f"norm_{n}.{p}": (E,) for n in ("state_pattern", "stored_pattern", "pattern_projection")
                 for p in ("weight", "bias")},
    "routing": {},
    "bet_sf": {"bet_w": (H, 2 * D)},  # w: [H_j ; K_j] -> one logit, per head
    "localness": {"localness_w_p.weight": (E, E), "localness_u.weight": (2, E)},  # W_p; U_p, U_d
    "relative": {"r_proj.weight": (E, E), "u_bias": (H, D), "v_bias": (H, D)},  # W_R; u, v
}
ADDED_BUFFERS = {"routing": {"centroids": (H // 2, 3, D), "centroids_initialized": ()}}  # VARIANT_FLAGS: 3 clusters


def per_layer(table):
    return {f"decoder.layers.{i}.self_attn.{name}": shape for i in range(LAYERS) for name, shape in table.items()}


def test_every_variant_is_counted_here():
    assert sorted(ADDED_PARAMETERS) == sorted(VARIANTS), "a new variant: add what it adds to ADDED_PARAMETERS"


@pytest.mark.parametrize("variant", sorted(ADDED_PARAMETERS))
@pytest.mark.parametrize("kind", ["translation", "lm"])
def test_a_variant_adds_exactly_its_own_tensors(dicts, kind, variant):
    """``--self-attn-mode NAME`` on a generic architecture against fairseq's own transformer of the same
    sizes: the models differ by exactly the variant's tensors in each decoder layer."""
    if kind == "translation":
        task, tiny, theirs, ours, extra = MT, TINY_TRANSLATION, "transformer_iwslt_de_en", "vanilla_iwslt", []
    else:  # fairseq's --arch transformer_lm takes its dataclass defaults (512-dim embeddings), not
        # base_lm_architecture's (embeddings of --decoder-embed-dim) as every bet_fairseq LM does; both post-norm
        task, tiny, theirs, ours, extra = LM, TINY_LM, "transformer_lm", "transformer_lm_wikitext2", [
            "--decoder-input-dim", E, "--decoder-output-dim", E]
    fairseq_model = build(dicts, task, theirs, *tiny, *extra)
    model = build(dicts, task, ours, *tiny, *variant_flags(variant))
    params, buffers = per_layer(ADDED_PARAMETERS[variant]), per_layer(ADDED_BUFFERS.get(variant, {}))
    mine, base = shapes(model), shapes(fairseq_model)
    assert {k: v for k, v in base.items() if k in mine} == base, "a fairseq tensor is missing or has another shape"
    assert {k: v for k, v in mine.items() if k not in base} == {**params, **buffers}
    assert n_params(model) - n_params(fairseq_model) == sum(math.prod(shape) for shape in params.values())
    attentions = decoder_self_attentions(model)
    assert len(attentions) == LAYERS and all(type(a) is VARIANTS[variant] for a in attentions)
    if kind == "translation":  # only the decoder self-attention changes (sparse_topk: also the encoder and the
        # cross-attention, Zhao et al.'s code's default; same parameters, tested in test_sparse_topk_cli.py)
        others = [layer.self_attn for layer in model.encoder.layers] + [layer.encoder_attn for layer in model.decoder.layers]
        kinds = {type(a) for a in others}
        assert kinds == ({SparseTopKAttention} if variant == "sparse_topk" else {MultiheadAttention})


@pytest.mark.parametrize("base, bet, task", [
    ("transformer_iwslt_de_en", "bet_sf_iwslt", MT),
    ("transformer_wmt_en_de", "bet_sf_wmt_en_de", MT),
    ("vanilla_lm", "bet_sf_lm", LM),
    ("vanilla_lm_enwik8", "bet_sf_lm_enwik8", LM),
])
def test_bet_sf_adds_exactly_w_at_full_size(dicts, base, bet, task):
    """BET(SF) adds exactly layers x heads x 2 x head_dim parameters (layers x 2 x head_dim with
    --bet-share-w) to the Transformer of its size; the architectures carry the paper's sizes."""
    vanilla = build(dicts, task, base)
    model = build(dicts, task, bet)
    layers = model.decoder.layers
    heads, head_dim = layers[0].self_attn.num_heads, layers[0].self_attn.head_dim
    assert n_params(model) - n_params(vanilla) == len(layers) * heads * 2 * head_dim
    shared = build(dicts, task, bet, "--bet-share-w")
    assert n_params(shared) - n_params(vanilla) == len(layers) * 2 * head_dim
    assert [a.variant_name for a in decoder_self_attentions(model)] == ["bet_sf"] * len(layers)
    sizes = (len(layers), model.decoder.embed_dim, heads)
    assert sizes == {"bet_sf_iwslt": (6, 512, 4), "bet_sf_wmt_en_de": (6, 512, 8), "bet_sf_lm": (6, 300, 4),
                     "bet_sf_lm_enwik8": (6, 512, 4)}[bet]


# ---------------------------------------------------------------- architecture configurations
SIZE_FIELDS = ("encoder_layers", "decoder_layers", "encoder_embed_dim", "decoder_embed_dim", "encoder_ffn_embed_dim",
               "decoder_ffn_embed_dim", "encoder_attention_heads", "decoder_attention_heads")
# The Table 2 rows by hand: the self-attention each row's architectures select, and its options.
ROW_SETTINGS = {
    "vanilla": dict(self_attn_mode="vanilla"),
    "bet_sf": dict(self_attn_mode="bet_sf"),
    "bet_sf_nodiagmask": dict(self_attn_mode="bet_sf", bet_keep_diagonal=True),
    "bet_sg": dict(self_attn_mode="vanilla"),
    "reduced_diag": dict(self_attn_mode="diag_scale", diag_scale=0.2),
    "magnified_diag": dict(self_attn_mode="diag_scale", diag_scale=2.0),
    "diag_scale": dict(self_attn_mode="diag_scale", diag_scale=0.5),  # given: --diag-scale 0.5
    "diagfree": dict(self_attn_mode="diag_free"),
    "localness": dict(self_attn_mode="localness"),
    "sparse_topk": dict(self_attn_mode="sparse_topk"),
    "hopfield": dict(self_attn_mode="hopfield"),
    "routing": dict(self_attn_mode="routing"),
}
# Sizes by hand: fairseq's own translation architectures; the LMs (layers, dim, FFN, heads) of the paper's
# LM settings (WikiText-103 with 6 heads: 8 do not divide 300). Transformer-XL has the same LM sizes.
TRANSLATION_SIZES = {"iwslt": "transformer_iwslt_de_en", "wmt_en_de": "transformer_wmt_en_de"}
LM_SIZES = {"lm": (6, 300, 1200, 4), "lm_wikitext103": (6, 300, 1200, 6), "lm_enwik8": (6, 512, 2048, 4)}


def arch_config(name, **given):
    args = Namespace(**given)
    ARCH_CONFIG_REGISTRY[name](args)
    return args


def lm_sizes(args):
    return args.decoder_layers, args.decoder_embed_dim, args.decoder_ffn_embed_dim, args.decoder_attention_heads


def test_every_row_is_listed_here():
    assert sorted(ROW_SETTINGS) == sorted(k for k, r in catalog.ROWS.items() if not r.own_model), (
        "a new row: add its settings to ROW_SETTINGS")


@pytest.mark.parametrize("row", sorted(ROW_SETTINGS))
def test_every_row_has_every_size(row):
    given = {"diag_scale": 0.5} if row == "diag_scale" else {}
    for size, fairseq_arch in TRANSLATION_SIZES.items():
        ours, theirs = arch_config(f"{row}_{size}", **given), arch_config(fairseq_arch)
        assert {f: getattr(ours, f) for f in SIZE_FIELDS} == {f: getattr(theirs, f) for f in SIZE_FIELDS}, size
        assert {k: getattr(ours, k) for k in ROW_SETTINGS[row]} == ROW_SETTINGS[row], size
    for size, sizes in LM_SIZES.items():
        ours = arch_config(f"{row}_{size}", **given)
        assert lm_sizes(ours) == sizes, size
        assert {k: getattr(ours, k) for k in ROW_SETTINGS[row]} == ROW_SETTINGS[row], size


def test_transformer_xl_has_the_lm_sizes():
    for size, sizes in LM_SIZES.items():
        assert lm_sizes(arch_config(f"transformer_xl_{size}")) == sizes, size


def test_legacy_names_are_their_canonical_architectures():
    aliases = catalog.legacy_arch_names()
    assert aliases["bet_vanilla_iwslt"] == "vanilla_iwslt"
    assert aliases["transformer_lm_wikitext2"] == "vanilla_lm"
    assert aliases["transformer_iwslt_de_en_reduced_diag"] == "reduced_diag_iwslt"
    for old, new in aliases.items():
        given = {"diag_scale": 0.5} if old.endswith("_diag_scale") else {}
        assert vars(arch_config(old, **given)) == vars(arch_config(new, **given)), old


def test_the_command_line_wins_over_the_architecture():
    """An architecture fills only what the command line left unset: any --self-attn-mode and size work on
    every name."""
    args = arch_config("bet_sf_iwslt", self_attn_mode="hopfield", decoder_layers=2)
    assert (args.self_attn_mode, args.decoder_layers, args.encoder_layers) == ("hopfield", 2, 6)
    args = arch_config("reduced_diag_lm", diag_scale=3.0)
    assert (args.self_attn_mode, args.diag_scale) == ("diag_scale", 3.0)
    with pytest.raises(ValueError, match="--arch diag_scale_iwslt needs --diag-scale C"):
        arch_config("diag_scale_iwslt")
