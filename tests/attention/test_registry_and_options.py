"""The variant registry: a variant dropped in at test time works end to end against a hand-written
reference; registration, option and checkpoint mistakes are clear errors that name the flag."""

import dataclasses
import math
import re
from argparse import Namespace

import pytest
import torch

from bet_fairseq.attention import (
    VARIANTS,
    SelfAttentionVariant,
    resolve_attention,
    register_variant,
    variant_options,
)
from conftest import assert_incremental_equals_full, assert_reorder_continues, full_forward, make_attention
from reference import reference_attention

E, H, T, B = 16, 4, 7, 3
TOY = "toy_half_temperature"


@pytest.fixture
def toy_variant():
    assert TOY not in VARIANTS

    @register_variant(TOY)
    class HalfTemperature(SelfAttentionVariant):
        def scores(self, q, k, allowed):
            return 0.5 * super().scores(q, k, allowed)

    try:
        yield HalfTemperature
    finally:
        VARIANTS.pop(TOY, None)


def test_a_variant_dropped_in_at_test_time_works(toy_variant):
    assert VARIANTS[TOY] is toy_variant and toy_variant.variant_name == TOY
    assert variant_options(Namespace(self_attn_mode=TOY)) == (toy_variant, None)
    m = make_attention(TOY, E, H)
    x = torch.randn(T, B, E)
    ref = reference_attention(m, x, "vanilla", logit_scale=0.5)  # softmax(0.5 Q K^T / sqrt(d)), causal
    out, w = full_forward(m, x, need_head_weights=True)
    torch.testing.assert_close(out.double(), ref.out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w.transpose(0, 1).double(), ref.probs, atol=1e-6, rtol=1e-5)
    fast, _ = full_forward(m, x, need_weights=False)
    torch.testing.assert_close(fast, out)
    vanilla_out = reference_attention(m, x, "vanilla").out
    assert not torch.allclose(out.double(), vanilla_out, atol=1e-3)  # the temperature does something
    assert_incremental_equals_full(m, x)
    assert_reorder_continues(m, x, torch.tensor([1, 1, 0]))


def test_the_test_variant_does_not_leak():
    assert TOY not in VARIANTS


def test_registration_mistakes_are_clear_errors():
    with pytest.raises(ValueError, match="'vanilla' is already registered by VanillaSelfAttention"):
        @register_variant("vanilla")
        class Other(SelfAttentionVariant):
            pass

    with pytest.raises(TypeError, match="decorates a SelfAttentionVariant subclass"):
        register_variant("toy_not_a_variant")(torch.nn.Module)

    with pytest.raises(TypeError, match="takes a dataclass"):
        register_variant("toy_bad_options", options=dict)(type("Toy", (SelfAttentionVariant,), {}))

    @dataclasses.dataclass
    class Clash:
        diag_scale: float = 2.0  # the flag of diag_scale, with another default

    with pytest.raises(ValueError, match="option 'diag_scale' is already defined differently by variant 'diag_scale'"):
        register_variant("toy_clash", options=Clash)(type("Toy", (SelfAttentionVariant,), {}))
    assert not {"toy_not_a_variant", "toy_bad_options", "toy_clash"} & set(VARIANTS)


# ------------------------------------------------------------------------------- options
def test_options_come_from_the_namespace():
    assert variant_options(Namespace()) == (VARIANTS["vanilla"], None)  # no mode: the Transformer
    cls, options = variant_options(Namespace(self_attn_mode="hopfield", hopfield_beta=0.9, hopfield_steps=3))
    assert cls is VARIANTS["hopfield"] and (options.hopfield_beta, options.hopfield_steps) == (0.9, 3)
    cls, options = variant_options(Namespace(self_attn_mode="bet_sf", bet_share_w=True, diag_scale=1.0))
    assert options.bet_share_w and not options.bet_keep_diagonal  # another mode's default is not "given"


@pytest.mark.parametrize("args, message", [
    (dict(self_attn_mode="bet_sf", diag_scale=0.5),
     "--diag-scale 0.5 only applies to --self-attn-mode diag_scale (the mode is 'bet_sf')"),
    (dict(self_attn_mode="vanilla", bet_keep_diagonal=True), "--bet-keep-diagonal True only applies to --self-attn-mode bet_sf"),
    (dict(self_attn_mode="localness", sparse_topk=4), "--sparse-topk 4 only applies to --self-attn-mode sparse_topk"),
    (dict(self_attn_mode="sparse_topk", hopfield_steps=2), "--hopfield-steps 2 only applies to --self-attn-mode hopfield"),
    (dict(self_attn_mode="diag_free", routing_clusters=4), "--routing-clusters 4 only applies to --self-attn-mode routing"),
], ids=["diag_scale", "bet", "topk", "hopfield", "routing"])
def test_options_of_another_variant_are_a_clear_error(args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        variant_options(Namespace(**args))


def test_unknown_mode_is_a_clear_error():
    names = ", ".join(sorted(VARIANTS))
    with pytest.raises(ValueError, match=re.escape(f"--self-attn-mode: unknown variant 'sparse'; choose one of {names}")):
        variant_options(Namespace(self_attn_mode="sparse"))
    with pytest.raises(KeyError):
        make_attention("sparse", E, H)


BAD_VALUES = [
    ("diag_scale", dict(diag_scale=-1.0), "--diag-scale must be a finite number >= 0"),
    ("diag_scale", dict(diag_scale=math.nan), "--diag-scale must be a finite number >= 0"),
    ("diag_scale", dict(diag_scale="big"), "--diag-scale must be a number"),
    ("sparse_topk", dict(sparse_topk=0), "--sparse-topk must be a whole number >= 1"),
    ("sparse_topk", dict(sparse_topk=-3), "--sparse-topk must be a whole number >= 1"),
    ("sparse_topk", dict(sparse_topk=2.5), "--sparse-topk must be a whole number >= 1"),
    ("hopfield", dict(hopfield_beta=0.0), "--hopfield-beta must be a finite number > 0"),
    ("hopfield", dict(hopfield_beta=-1.0), "--hopfield-beta must be a finite number > 0"),
    ("hopfield", dict(hopfield_beta=math.inf), "--hopfield-beta must be a finite number > 0"),
    ("hopfield", dict(hopfield_steps=0), "--hopfield-steps must be a whole number >= 1"),
    ("routing", dict(routing_clusters=0), "--routing-clusters must be an integer >= 1"),
    ("routing", dict(routing_window=0), "--routing-window must be an integer >= 1"),
    ("routing", dict(routing_heads=5), "--routing-heads must be an integer between 0 and the number of heads (4)"),
    ("routing", dict(routing_heads=-1), "--routing-heads must be an integer between 0 and the number of heads (4)"),
    ("routing", dict(routing_ema_decay=1.0), "--routing-ema-decay must be a number in [0, 1)"),
    ("routing", dict(routing_ema_decay=-0.1), "--routing-ema-decay must be a number in [0, 1)"),
]


@pytest.mark.parametrize("mode, options, message", BAD_VALUES,
                         ids=[f"{m}-{next(iter(o))}={next(iter(o.values()))}" for m, o, _ in BAD_VALUES])
def test_bad_option_values_are_clear_errors_naming_the_flag(mode, options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        resolve_attention(Namespace(self_attn_mode=mode, **options), num_heads=H)  # before a model is built
    with pytest.raises(ValueError, match=re.escape(message)):
        make_attention(mode, E, H, **options)


def test_a_variant_without_options_refuses_them():
    with pytest.raises(TypeError, match="takes no options"):
        make_attention("diag_free", E, H, diag_scale=0.5)


# ------------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("mode", sorted(VARIANTS))
def test_state_dict_of_the_same_variant_is_accepted(mode):
    m = make_attention(mode, E, H)
    m.upgrade_state_dict_named({f"layer.{k}": v for k, v in m.state_dict().items()}, "layer")


@pytest.mark.parametrize("theirs, ours, message", [
    ("vanilla", "bet_sf", "checkpoint has no layer.bet_w, which a 'bet_sf' self-attention needs"),
    ("bet_sf", "vanilla", "checkpoint holds layer.bet_w, which a 'vanilla' self-attention does not have"),
    ("routing", "vanilla", "checkpoint holds layer.centroids, which a 'vanilla' self-attention does not have"),
    ("localness", "relative", "checkpoint holds layer.localness_u.weight, which a 'relative' self-attention"),
])
def test_state_dict_of_another_variant_is_a_clear_error(theirs, ours, message):
    sd = {f"layer.{k}": v for k, v in make_attention(theirs, E, H).state_dict().items()}
    with pytest.raises(ValueError, match=re.escape(message) + ".*trained with another --self-attn-mode"):
        make_attention(ours, E, H).upgrade_state_dict_named(sd, "layer")


def test_diag_scale_zero_sets_the_diagonal_logits_to_zero():
    # Figure 3's sweep starts at 0: the own logit becomes 0 (not -inf, which is DiagFreeMask), so a query still
    # gives itself weight exp(0) / Z; here one query and two keys with logits (2, own 3) -> softmax of (2, 0).
    import torch

    m = make_attention("diag_scale", E, H, diag_scale=0.0)
    q = torch.zeros(1, 1, 2, 1)
    k = torch.zeros(1, 1, 2, 1)
    q[..., 1, 0], k[..., 0, 0], k[..., 1, 0] = 1.0, 2.0, 3.0
    allowed = torch.tensor([[True, False], [True, True]])
    scores = m.scores(q, k, allowed)
    assert float(scores[0, 0, 1, 1]) == 0.0 and float(scores[0, 0, 1, 0]) == 2.0
