"""``--self-attn-mode bet_sf --bet-form authors / authors_lm`` (the first author's code) as a fairseq module: the
loop-by-loop reference (``reference_bet_authors``), parameters counted by hand, incremental decoding and beam
reordering, the generic checks of every variant, the unchanged ``equations`` default and clear errors."""

import re
from argparse import Namespace

import pytest
import torch
from fairseq.modules.multihead_attention import MultiheadAttention

import test_every_variant as generic
from bet_fairseq.attention import resolve_attention, variant_options
from bet_fairseq.attention.bet_sf import BetOptions, BetSFSelfAttention
from bet_fairseq.core import bet_sf_attention
from cli_utils import TINY_TRANSLATION, build_model, n_params, toy_dictionaries
from conftest import (
    assert_incremental_equals_full, assert_matches_reference, assert_reorder_continues, decode, full_forward,
    make_attention, make_sharp, padding_mask,
)
from reference import reference_bet_authors, reference_for

E, H, T, B = 16, 4, 7, 3
D = E // H
FORMS = ["authors", "authors_lm"]
CASES = [(form, keep) for form in FORMS for keep in (False, True)]
CASE_IDS = [f"{form}{'-keepdiag' if keep else ''}" for form, keep in CASES]


def make_authors(form, keep_diagonal=False, seed=0, dropout=0.0):
    """The authors' form with its R weights far from their init, so that R varies visibly."""
    m = make_attention("bet_sf", E, H, seed=seed, dropout=dropout, bet_form=form, bet_keep_diagonal=keep_diagonal)
    with torch.no_grad():
        m.bet_authors_w.weight.normal_(0, 1.0)
        m.bet_authors_w.bias.normal_(0, 1.0)
    return m


def force_fused(m, fused):
    m.use_fused_attention = fused
    m.cpu_exact_max_keys = 0 if fused else BetSFSelfAttention.cpu_exact_max_keys


# ------------------------------------------------------------------------------- (a) the reference
@pytest.mark.parametrize("form, keep", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("fused", [False, True], ids=["exact", "fused"])
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_full_forward_matches_the_reference(form, keep, fused, padded):
    m = make_authors(form, keep)
    force_fused(m, fused)
    kpm = padding_mask(B, T, left=[(2, 3)], right=[(1, 2)]) if padded else None
    x = torch.randn(T, B, E)
    ref = reference_bet_authors(m, x, kpm)
    out, _ = full_forward(m, x, kpm, need_weights=False)
    torch.testing.assert_close(out.double(), ref.out, atol=1e-5, rtol=1e-5)
    assert ref.r.std() > 0.05, "R varies"


@pytest.mark.parametrize("form, keep", CASES, ids=CASE_IDS)
def test_weights_capture_and_cached_r_match_the_reference(form, keep):
    m = make_authors(form, keep)
    x = torch.randn(T, B, E)
    ref = reference_bet_authors(m, x)
    _, w = full_forward(m, x, need_head_weights=True)
    w = w.transpose(0, 1)
    torch.testing.assert_close(w.double(), ref.probs, atol=1e-6, rtol=1e-5)
    assert torch.all(w[..., torch.ones(T, T, dtype=torch.bool).triu(1)] == 0), "the causal mask is re-applied"
    assert torch.allclose(w[..., 0, 0], torch.ones(())), "row 0 keeps its diagonal"
    diag = torch.diagonal(w, dim1=-2, dim2=-1)[..., 1:]
    assert m.masks_diagonal == (not keep) and (torch.all(diag > 0) if keep else torch.all(diag == 0))
    m.capture_attention = True
    full_forward(m, x, need_weights=False)
    torch.testing.assert_close(m.captured_attention.double(), ref.probs, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(m.captured_first_pass.double(), ref.first, atol=1e-6, rtol=1e-5)
    m.capture_attention = False
    _, _, state = decode(m, x)
    saved = m._get_input_buffer(state)
    assert sorted(k for k in saved if k.startswith("prev_variant_")) == ["prev_variant_bet_r"], "only R is cached"
    torch.testing.assert_close(saved["prev_variant_bet_r"].double(), ref.r, atol=1e-6, rtol=1e-5)


# ------------------------------------------------------------------------------- (b) parameters by hand
@pytest.mark.parametrize("form", FORMS)
def test_parameters_are_vanilla_plus_w_with_bias_plus_a_second_output_projection(form):
    vanilla = dict(MultiheadAttention(E, H, self_attention=True).named_parameters())
    m = make_attention("bet_sf", E, H, bet_form=form)
    mine = dict(m.named_parameters())
    extra = {n: tuple(p.shape) for n, p in mine.items() if n not in vanilla}
    assert extra == {"bet_authors_w.weight": (1, 2 * D), "bet_authors_w.bias": (1,),
                     "bet_out_proj2.weight": (E, E), "bet_out_proj2.bias": (E,)}
    assert n_params(m) - sum(p.numel() for p in vanilla.values()) == (2 * D + 1) + (E * E + E)


@pytest.fixture(scope="module")
def dicts(tmp_path_factory):
    return toy_dictionaries(tmp_path_factory.mktemp("dicts"))


def test_a_whole_iwslt_model_adds_per_decoder_layer_w_with_bias_and_a_projection(dicts):
    """bet_sf_iwslt --bet-form authors against fairseq's transformer_iwslt_de_en (6 decoder layers, 512 dims,
    4 heads of 128): 6 x ((2 x 128 + 1) + (512^2 + 512)) = 1,577,478 more parameters."""
    task = [dicts, "--task", "translation", "-s", "de", "-t", "en"]
    vanilla = build_model([*task, "--arch", "transformer_iwslt_de_en"])[0]
    authors = build_model([*task, "--arch", "bet_sf_iwslt", "--bet-form", "authors"])[0]
    assert n_params(authors) - n_params(vanilla) == 6 * ((2 * 128 + 1) + (512 * 512 + 512)) == 1_577_478
    tiny = build_model([*task, *TINY_TRANSLATION, "--arch", "bet_sf_iwslt", "--bet-form", "authors_lm"])[0]
    assert {str(layer.self_attn.options.bet_form) for layer in tiny.decoder.layers} == {"authors_lm"}


# ------------------------------------------------------------------------------- (c) decoding
@pytest.mark.parametrize("form, keep", CASES, ids=CASE_IDS)
def test_incremental_decoding_equals_full_and_beam_reorder_continues(form, keep):
    m = make_authors(form, keep)
    x = torch.randn(T, B, E)
    state = assert_incremental_equals_full(m, x)
    assert m._get_input_buffer(state)["prev_variant_bet_r"].shape == (B, H, T), "R per key, batch-first"
    before = assert_reorder_continues(m, x, torch.tensor([2, 0, 0]))
    assert before["prev_variant_bet_r"].shape == (B, H, 3)


@pytest.mark.parametrize("form", FORMS)
def test_every_variant_generic_checks_hold_for_the_authors_forms(form, monkeypatch):
    """tests/attention/test_every_variant.py's checks, run on ``bet_sf`` with ``--bet-form FORM``."""
    monkeypatch.setitem(generic.OPTIONS, "bet_sf", dict(bet_form=form))
    for need_weights in (False, True):
        generic.test_fresh_module_is_causal_on_its_first_training_batch("bet_sf", need_weights)
    generic.test_incremental_decoding_equals_full_forward("bet_sf")
    generic.test_reorder_incremental_state_reorders_every_cached_tensor("bet_sf")
    for training in (False, True):
        generic.test_left_padding_is_finite_and_does_not_leak("bet_sf", training)
    generic.test_capture_keeps_the_per_head_weights_with_gradients("bet_sf")
    for case in ("plain", "huge_logits"):
        generic.test_bfloat16_training_steps_stay_finite("bet_sf", case)
    assert str(generic.build("bet_sf").options.bet_form) == form


# ------------------------------------------------------------------------------- (d) the default
def test_the_default_form_is_the_equations_unchanged():
    assert BetOptions().bet_form == "equations" and BetOptions().bet_keep_diagonal is False
    m = make_sharp("bet_sf", E, H)
    vanilla = dict(MultiheadAttention(E, H, self_attention=True).named_parameters())
    assert [n for n, _ in m.named_parameters() if n not in vanilla] == ["bet_w"]
    x = torch.randn(T, B, E)
    assert_matches_reference(m, x, padding_mask(B, T, left=[(2, 3)], right=[(1, 2)]))  # the existing reference
    torch.testing.assert_close(full_forward(m, x, need_head_weights=True)[1].transpose(0, 1).double(),
                               reference_for(m, x).probs, atol=1e-6, rtol=1e-5)
    # bit for bit: the equations' functions, then out_proj (no second projection)
    scale, split = m.scaling, m.split_heads
    q, k, v = split(m.q_proj(x) * scale), split(m.k_proj(x)), split(m.v_proj(x))
    allowed = torch.ones(T, T, dtype=torch.bool).tril().view(1, 1, T, T)
    heads = bet_sf_attention(q, k, v, m.bet_w, allowed)[0]
    expected = m.out_proj(heads.permute(2, 0, 1, 3).reshape(T, B, E))
    assert torch.equal(full_forward(m, x, need_weights=True)[0], expected)


# ------------------------------------------------------------------------------- (e) errors
def test_a_bad_bet_form_is_a_clear_error(dicts, capsys):
    args = Namespace(self_attn_mode="bet_sf", bet_form="paper")
    with pytest.raises(ValueError, match=re.escape("--bet-form: unknown form 'paper'; choose one of equations, "
                                                   "authors, authors_lm")):
        resolve_attention(args, H)
    with pytest.raises(ValueError, match="--bet-form: unknown form 'paper'"):
        make_attention("bet_sf", E, H, bet_form="paper")
    with pytest.raises(SystemExit):  # fairseq's command line: argparse's choices
        build_model([dicts, "--task", "translation", "-s", "de", "-t", "en", "--arch", "bet_sf_iwslt",
                     "--bet-form", "paper"])
    assert "--bet-form: invalid choice: 'paper' (choose from" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (dict(self_attn_mode="bet_sf", bet_form="authors", bet_share_w=True),
     "--bet-share-w only applies to --bet-form equations (--bet-form authors always shares one w by all heads)"),
    (dict(self_attn_mode="vanilla", bet_form="authors"),
     "--bet-form authors only applies to --self-attn-mode bet_sf (the mode is 'vanilla')"),
], ids=["share_w_with_authors", "another_mode"])
def test_options_that_do_not_go_together_are_clear_errors(args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        resolve_attention(Namespace(**args), H)


def test_options_reach_the_module():
    cls, options = variant_options(Namespace(self_attn_mode="bet_sf", bet_form="authors_lm"))
    assert cls is BetSFSelfAttention and str(options.bet_form) == "authors_lm"


@pytest.mark.parametrize("theirs, ours", [("equations", "authors"), ("authors_lm", "equations")])
def test_a_checkpoint_of_another_form_is_a_clear_error(theirs, ours):
    sd = {f"layer.{k}": v for k, v in make_attention("bet_sf", E, H, bet_form=theirs).state_dict().items()}
    named = "authors or authors_lm" if theirs != "equations" else theirs
    with pytest.raises(ValueError, match=re.escape(f"checkpoint's layer is a --bet-form {named} BET(SF), this model "
                                                   f"is --bet-form {ours}")):
        make_attention("bet_sf", E, H, bet_form=ours).upgrade_state_dict_named(sd, "layer")
    same = make_attention("bet_sf", E, H, bet_form=theirs)
    same.upgrade_state_dict_named(sd, "layer")  # the same form loads
