"""``capture_attention``, the attention package's capture API: on for the ``with`` block only, what each
layer recorded (held to the float64 reference), the previous setting restored and the records dropped
afterwards, an exception inside the block included; a model's decoder self-attentions in layer order."""

import pytest
import torch

from cli_utils import build_model, toy_dictionaries
from conftest import full_forward, make_attention
from reference import reference_attention

from bet_fairseq.attention.capture import AttentionCapture, capture_attention, decoder_self_attentions

E, H, T, B = 16, 4, 6, 2


def modules():
    return [make_attention("bet_sf", E, H, seed=0), make_attention("diag_scale", E, H, seed=1, diag_scale=0.5)]


def is_reset(m, capture=False):
    return (m.capture_attention is capture and m.captured_attention is None and m.captured_log_attention is None
            and m.captured_first_pass is None)


def test_records_are_the_attention_used_and_are_dropped_afterwards():
    bet, diag = mods = modules()
    x = torch.randn(T, B, E)
    with capture_attention(mods) as captured:
        assert isinstance(captured, AttentionCapture) and len(captured) == 2
        assert all(m.capture_attention for m in mods)
        for m in mods:
            full_forward(m, x, need_weights=False)  # capture does not wait for need_weights
        first, second = captured.layers()
    assert all(is_reset(m) for m in mods)
    want = reference_attention(bet, x, "bet_sf")
    torch.testing.assert_close(first.probs.double(), want.probs, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(first.first_pass.double(), want.first, atol=1e-6, rtol=1e-5)
    visible = want.probs > 0
    torch.testing.assert_close(first.log_probs.double()[visible], want.probs.log()[visible], atol=1e-5, rtol=1e-5)
    assert first.log_probs.dtype == torch.float32
    want = reference_attention(diag, x, "diag_scale")
    torch.testing.assert_close(second.probs.double(), want.probs, atol=1e-6, rtol=1e-5)
    assert second.first_pass is None  # one pass only
    assert second.probs.requires_grad  # with gradients, for losses on attention


def test_an_exception_inside_the_block_still_resets():
    mods = modules()
    x = torch.randn(T, B, E)
    with pytest.raises(RuntimeError, match="inside the block"):
        with capture_attention(mods):
            full_forward(mods[0], x)
            assert mods[0].captured_attention is not None
            raise RuntimeError("inside the block")
    assert all(is_reset(m) for m in mods)


def test_the_previous_setting_is_restored_and_clear_forgets_a_forward():
    bet, diag = mods = modules()
    bet.capture_attention = True  # switched on by someone else
    x = torch.randn(T, B, E)
    with capture_attention(mods) as captured:
        full_forward(bet, x)
        captured.clear()
        assert captured.layers()[0].probs is None
    assert is_reset(bet, capture=True) and is_reset(diag)


@pytest.fixture(scope="module")
def dicts(tmp_path_factory):
    return toy_dictionaries(tmp_path_factory.mktemp("dicts"))


LM = ["--task", "language_modeling", "--decoder-layers", "3", "--decoder-embed-dim", "16", "--decoder-ffn-embed-dim",
      "32", "--decoder-attention-heads", "2"]


def test_a_model_is_captured_layer_by_layer(dicts):
    model, _, _ = build_model([dicts, *LM, "--arch", "bet_sf_lm", "--self-attn-layers", "1"])
    model.eval()
    tokens = torch.tensor([[4, 5, 6, 7, 8]])
    with torch.no_grad(), capture_attention(model) as captured:
        model(tokens)
        layers = captured.layers()
    assert [m.variant_name for m in captured.modules] == ["vanilla", "bet_sf", "vanilla"]
    assert [layer.first_pass is not None for layer in layers] == [False, True, False]
    assert all(layer.probs.shape == (1, 2, 5, 5) for layer in layers)
    assert all(is_reset(m) for m in decoder_self_attentions(model))


def test_fairseqs_own_attention_is_converted_only_when_asked(dicts):
    model, _, _ = build_model([dicts, *LM, "--arch", "transformer_lm"])
    with pytest.raises(ValueError, match="decoder layer 0: self_attn is fairseq's MultiheadAttention"):
        with capture_attention(model):
            pass
    with torch.no_grad(), capture_attention(model, convert=True) as captured:
        model.eval()(torch.tensor([[4, 5, 6]]))
        assert all(layer.probs.shape == (1, 2, 3, 3) for layer in captured.layers())
