"""``--hopfield-config library``: the Hopfield layer of ml-jku/hopfield-layers with its defaults, against a
naive float64 reading of that library's code (tests/reference.py), causal in every update step, per-row
stopping (a decoding step and a lone sequence give what the full batch gives), its parameters by hand and
its option errors. The version 0.1 configuration (``attention``) stays as it was."""

import math

import pytest
import torch
from fairseq.modules.multihead_attention import MultiheadAttention

from bet_fairseq.attention import VARIANTS
from bet_fairseq.option_history import options_added
from conftest import assert_decoding_consistent, full_forward, make_attention, padding_mask
from reference import reference_attention, reference_hopfield_library

E, H, T, B = 16, 4, 9, 3
D = E // H


def sharp(seed=0, **options):
    """A library-config module whose weights are drawn far from the library's init (std 0.02 gives
    near-uniform associations that converge at once), with distinct LayerNorm affines, so that every
    piece and every update step shows in the output."""
    m = make_attention("hopfield", E, H, seed=seed, **options)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for p_name, p in m.named_parameters():
            if p_name.startswith("norm_"):
                p.copy_((1.0 if p_name.endswith("weight") else 0.0) + 0.3 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_((0.5 if p_name.endswith("weight") else 0.2) * torch.randn(p.shape, generator=gen))
    return m


def heads_of(options):
    return options.get("hopfield_heads") or H  # the model's heads unless --hopfield-heads


CASES = {
    "defaults": {},  # update_steps_max 0: one association
    "max3_eps1e-2": dict(hopfield_update_steps_max=3, hopfield_update_steps_eps=1e-2),
    "unbounded_eps1e-3": dict(hopfield_update_steps_max=-1, hopfield_update_steps_eps=1e-3),
    "one_head_steps3_beta": dict(hopfield_heads=1, hopfield_steps=3, hopfield_beta=0.3, hopfield_update_steps_eps=1e-3),
    "two_heads_max2": dict(hopfield_heads=2, hopfield_update_steps_max=2),
}


def test_the_default_is_the_library_configuration():
    m = make_attention("hopfield", 64, 8)
    assert m.options.hopfield_config == "library" and (m.num_heads, m.head_dim) == (8, 8)
    assert m.hopfield_beta == pytest.approx(1 / math.sqrt(8)) and m.hopfield_steps == 1 and m.hopfield_eps == 1e-4
    for proj in (m.q_proj, m.k_proj, m.v_proj, m.out_proj):  # HopfieldCore.reset_parameters
        assert 0.017 < float(proj.weight.std()) < 0.023 and torch.all(proj.bias == 0)
    for norm in (m.norm_state_pattern, m.norm_stored_pattern, m.norm_pattern_projection):
        assert torch.all(norm.weight == 1) and torch.all(norm.bias == 0) and norm.eps == 1e-5
    # what a checkpoint saved before the option gets
    assert options_added(m.options_class)["hopfield_config"].before == "attention"


@pytest.mark.parametrize("options", CASES.values(), ids=CASES.keys())
def test_matches_the_library_reference(options):
    m = sharp(**options)
    x = torch.randn(T, B, E, generator=torch.Generator().manual_seed(1)) * 2
    ref = reference_hopfield_library(m, x, heads_of(options))
    if options.get("hopfield_update_steps_max", 0) or options.get("hopfield_steps", 1) > 1:
        assert len(ref.updates.unique()) > 1, "rows stop after different numbers of updates here"
    _, w = full_forward(m, x, need_head_weights=True)
    torch.testing.assert_close(w.transpose(0, 1).double(), ref.probs, atol=1e-5, rtol=1e-4)
    for fused in (False, True):
        m.use_fused_attention = fused
        out, _ = full_forward(m, x, need_weights=False)
        torch.testing.assert_close(out.double(), ref.out, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("options", [CASES["defaults"], CASES["max3_eps1e-2"]], ids=["defaults", "max3_eps1e-2"])
def test_padding_matches_the_library_reference(options):
    m = sharp(**options)
    x = torch.randn(T, B, E, generator=torch.Generator().manual_seed(2)) * 2
    kpm = padding_mask(B, T, left=[(1, 2)], right=[(2, 3)])
    ref = reference_hopfield_library(m, x, heads_of(options), kpm)
    out, _ = full_forward(m, x, kpm, need_weights=False)
    torch.testing.assert_close(out.double(), ref.out, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("need_weights", [False, True], ids=["fast", "exact"])
def test_causal_in_every_update_step(need_weights):
    m = sharp(**CASES["unbounded_eps1e-3"]).train()
    x = torch.randn(T, B, E) * 2
    for t in range(T - 1):
        y = x.clone()
        y[t + 1:] = torch.randn(T - t - 1, B, E) * 2
        a, _ = full_forward(m, x, need_weights=need_weights)
        b, _ = full_forward(m, y, need_weights=need_weights)
        assert torch.equal(a[: t + 1], b[: t + 1]), f"position <= {t} saw a later token"
        assert not torch.allclose(a[t + 1:], b[t + 1:])


@pytest.mark.parametrize("options", CASES.values(), ids=CASES.keys())
def test_incremental_decoding_equals_the_full_pass(options):
    assert_decoding_consistent(sharp(**options), torch.randn(T, B, E) * 2, torch.tensor([2, 0, 0]), 4)


def test_a_sequence_alone_gives_what_it_gives_in_a_batch():
    """The stopping decision is per query row (the library's is per head over the batch)."""
    m = sharp(**CASES["max3_eps1e-2"])
    x = torch.randn(T, B, E) * 2
    together, _ = full_forward(m, x, need_weights=False)
    for b in range(B):
        alone, _ = full_forward(m, x[:, b:b + 1], need_weights=False)
        torch.testing.assert_close(alone[:, 0], together[:, b], atol=1e-5, rtol=1e-5)


def test_capture_is_the_last_association():
    m = sharp(**CASES["max3_eps1e-2"])
    m.capture_attention = True
    x = torch.randn(T, B, E) * 2
    full_forward(m, x, need_weights=False)
    torch.testing.assert_close(m.captured_attention.double(), reference_hopfield_library(m, x, H).probs,
                               atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("heads", [None, 1])
def test_parameters_by_hand(heads):
    m = make_attention("hopfield", E, H, hopfield_heads=heads)
    assert (m.num_heads, m.head_dim) == ((H, D) if heads is None else (1, E))
    # q, k, v, out: E x E weights and E biases (hflayers: in_proj_weight 3E x E, in_proj_bias 3E, out_proj E x E + E);
    # three affine LayerNorms over E: weight and bias each
    assert sum(p.numel() for p in m.parameters()) == 4 * (E * E + E) + 3 * 2 * E
    vanilla = MultiheadAttention(E, H, self_attention=True)
    ours = {n: tuple(p.shape) for n, p in m.named_parameters()}
    theirs = {n: tuple(p.shape) for n, p in vanilla.named_parameters()}
    norms = ("state_pattern", "stored_pattern", "pattern_projection")
    expected = [(f"norm_{n}.{p}", (E,)) for n in norms for p in ("weight", "bias")]
    assert sorted(ours.items() - theirs.items()) == sorted(expected)


def test_the_attention_configuration_is_version_0_1s():
    m = make_attention("hopfield", E, H, hopfield_config="attention", hopfield_steps=3, hopfield_beta=0.9)
    assert not any(n.startswith("norm_") for n, _ in m.named_parameters()) and m.num_heads == H
    x = torch.randn(T, B, E)
    ref = reference_attention(m, x, "hopfield")
    out, _ = full_forward(m, x, need_weights=False)
    torch.testing.assert_close(out.double(), ref.out, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("options, message", [
    (dict(hopfield_config="bogus"), "--hopfield-config must be one of library, attention, got 'bogus'"),
    (dict(hopfield_update_steps_max=-2), "--hopfield-update-steps-max must be a whole number >= -1"),
    (dict(hopfield_update_steps_max=1.5), "--hopfield-update-steps-max must be a whole number >= -1"),
    (dict(hopfield_update_steps_eps=0.0), "--hopfield-update-steps-eps must be a finite number > 0"),
    (dict(hopfield_update_steps_eps=math.nan), "--hopfield-update-steps-eps must be a finite number > 0"),
    (dict(hopfield_heads=0), "--hopfield-heads must be a whole number >= 1"),
    (dict(hopfield_steps=3, hopfield_update_steps_max=1), "--hopfield-steps 3 .* and --hopfield-update-steps-max 1"),
    (dict(hopfield_config="attention", hopfield_heads=2), "--hopfield-heads applies to --hopfield-config library"),
    (dict(hopfield_config="attention", hopfield_update_steps_eps=0.1),
     "--hopfield-update-steps-eps applies to --hopfield-config library"),
], ids=["config", "max_negative", "max_fraction", "eps_zero", "eps_nan", "heads_zero", "steps_disagree",
        "heads_attention", "eps_attention"])
def test_bad_values_name_the_flag(options, message):
    cls = VARIANTS["hopfield"]
    with pytest.raises(ValueError, match=message):
        cls.check_options(cls.options_class(**options), H)


def test_heads_must_divide_the_model_dimension():
    with pytest.raises(ValueError, match="--hopfield-heads 3 must divide the model dimension 16"):
        make_attention("hopfield", E, H, hopfield_heads=3)


def test_a_new_checkpoint_stores_the_configuration_and_an_older_one_reads_attention():
    """resolve_attention writes the default into the model options (so the checkpoint holds it); the value compat
    fills into a checkpoint from before the option is no error for another variant."""
    from argparse import Namespace

    from bet_fairseq.attention import resolve_attention, variant_options

    args = Namespace(self_attn_mode="hopfield")
    resolve_attention(args, H)
    assert args.hopfield_config == "library"
    cls, options = variant_options(Namespace(self_attn_mode="bet_sf", hopfield_config="attention"))
    assert cls.variant_name == "bet_sf"
