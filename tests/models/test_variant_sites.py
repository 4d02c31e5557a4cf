"""A variant says in its own class which attention sites it replaces: one defined here, in the test, that
also replaces the encoder self-attention and the encoder-decoder attention gets them built by the
translation model (no model file names it), with the keyword arguments fairseq gives its own there; a
language model, which has neither site, never asks for them; the model resolves the options once."""

import dataclasses
from dataclasses import dataclass, field

import pytest
import torch
from fairseq.modules.multihead_attention import MultiheadAttention

from cli_utils import TINY_TRANSLATION, build_model, toy_dictionaries

import bet_fairseq.attention as attention
from bet_fairseq.attention import (CROSS, DECODER_SELF, ENCODER_SELF, VARIANTS, ModelAttention, SelfAttentionVariant,
                                   register_variant)

TOY = "toy_every_site"


class MarkedAttention(MultiheadAttention):
    """fairseq's attention, marked with the site it was built for and the options it was given."""

    def __init__(self, embed_dim, num_heads, site=None, scale=None, **kwargs):
        super().__init__(embed_dim, num_heads, **kwargs)
        self.site, self.scale, self.kwargs = site, scale, kwargs


@dataclass
class ToyOptions:
    toy_site_scale: float = field(default=1.5, metadata={"help": "test only"})


@pytest.fixture
def toy_every_site():
    assert TOY not in VARIANTS

    @register_variant(TOY, options=ToyOptions)
    class EverySite(SelfAttentionVariant):
        sites = frozenset({DECODER_SELF, ENCODER_SELF, CROSS})

        @classmethod
        def build_site_attention(cls, site, options, embed_dim, num_heads, **mha_kwargs):
            return MarkedAttention(embed_dim, num_heads, site=site, scale=options.toy_site_scale, **mha_kwargs)

    try:
        yield EverySite
    finally:
        VARIANTS.pop(TOY, None)


@pytest.fixture(scope="module")
def dicts(tmp_path_factory):
    return toy_dictionaries(tmp_path_factory.mktemp("dicts"))


MT = ["--task", "translation", "-s", "de", "-t", "en", *TINY_TRANSLATION]


def test_a_variant_declaring_every_site_gets_each_built(dicts, toy_every_site, monkeypatch):
    resolved = []
    real = attention.variant_options
    monkeypatch.setattr(attention, "variant_options", lambda args: resolved.append(1) or real(args))
    model, _, _ = build_model([dicts, *MT, "--arch", "vanilla_iwslt", "--self-attn-mode", TOY])
    assert len(resolved) == 1, "the options are resolved once per model, not per layer"
    for layer in model.encoder.layers:
        assert isinstance(layer.self_attn, MarkedAttention) and layer.self_attn.site == ENCODER_SELF
        assert layer.self_attn.scale == 1.5 and layer.self_attn.self_attention
    for layer in model.decoder.layers:
        assert type(layer.self_attn) is toy_every_site
        cross = layer.encoder_attn
        assert isinstance(cross, MarkedAttention) and cross.site == CROSS and cross.encoder_decoder_attention
        assert cross.kwargs["kdim"] == cross.kwargs["vdim"] == 32  # what fairseq's layer gives its own
    src = torch.tensor([[5, 6, 7, 2]])
    out, _ = model(src, torch.tensor([4]), torch.tensor([[2, 8, 9]]))
    assert out.shape == (1, 3, len(model.decoder.dictionary)) and torch.isfinite(out).all()


def test_without_the_declaration_the_other_sites_stay_fairseqs(dicts, toy_every_site, monkeypatch):
    monkeypatch.setattr(toy_every_site, "sites", frozenset({DECODER_SELF}))
    model, _, _ = build_model([dicts, *MT, "--arch", "vanilla_iwslt", "--self-attn-mode", TOY])
    assert not any(isinstance(m, MarkedAttention) for m in model.modules())
    assert all(type(layer.self_attn) is toy_every_site for layer in model.decoder.layers)


def test_a_language_model_asks_for_its_one_site_only(dicts, toy_every_site):
    model, _, _ = build_model([dicts, "--task", "language_modeling", "--decoder-layers", "2", "--decoder-embed-dim",
                               "32", "--decoder-ffn-embed-dim", "64", "--decoder-attention-heads", "4",
                               "--arch", "vanilla_lm", "--self-attn-mode", TOY])
    assert not any(isinstance(m, MarkedAttention) for m in model.modules())
    assert all(type(layer.self_attn) is toy_every_site for layer in model.decoder.layers)


def test_the_resolved_attention_refuses_a_site_the_model_lacks(toy_every_site):
    lm = ModelAttention(toy_every_site, ToyOptions(), frozenset({DECODER_SELF}))
    with pytest.raises(ValueError, match="attention site 'cross' is not one of this model's: decoder_self"):
        lm.build(CROSS, 16, 2)
    assert dataclasses.is_dataclass(lm) and type(lm.build(DECODER_SELF, 16, 2)) is toy_every_site
