"""Decoder-only BET language models: fairseq's TransformerLanguageModel with every layer's
self-attention replaced (BET_SPEC: "language modelling: every layer").

Sizes (BET_SPEC section 5 and the authors' LM settings), all 6 layers, pre-norm as fairseq's LM:
``wikitext2``   embed/hidden 300, 4 heads, FFN 1200
``wikitext103`` embed/hidden 300, 6 heads, FFN 1200 (the authors' 8 heads do not divide 300)
``enwik8``      embed/hidden 512, 4 heads, FFN 2048
Architectures: ``bet_sf_lm`` (wikitext2 sizes), ``bet_sf_lm_{wikitext103,enwik8}``,
``bet_sf_nodiagmask_lm[_SIZE]``, and ``transformer_lm_SIZE[_VARIANT]`` for the vanilla baseline
and the diagonal ablations at the same sizes.
"""

from dataclasses import dataclass

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer_lm import (
    TransformerLanguageModel,
    TransformerLanguageModelConfig,
    base_lm_architecture,
)

from ..modules.bird_eye_config import (
    BirdEyeAttentionConfig,
    attention_settings,
    set_attention_defaults,
)
from ..modules.bird_eye_decoder import BirdEyeTransformerDecoder
from .bet_transformer import ATTENTION_VARIANTS


@dataclass
class BirdEyeLanguageModelConfig(TransformerLanguageModelConfig, BirdEyeAttentionConfig):
    pass


@register_model("bet_transformer_lm", dataclass=BirdEyeLanguageModelConfig)
class BirdEyeTransformerLanguageModel(TransformerLanguageModel):
    @classmethod
    def build_model(cls, args, task):
        bet_lm_base(args)
        attention_settings(args)  # fail on bad options before anything is built
        # fairseq's builder hard-codes its decoder class; keep its embeddings (character,
        # adaptive input ...) and rebuild the decoder around them.
        embed_tokens = super().build_model(args, task).decoder.embed_tokens
        return cls(BirdEyeTransformerDecoder(args, task.target_dictionary, embed_tokens, no_encoder_attn=True))


def bet_lm_base(args):
    """Defaults of ``--arch bet_transformer_lm`` (fairseq registers that name as a no-op)."""
    set_attention_defaults(args)
    base_lm_architecture(args)


LM_SIZES = {
    "wikitext2": dict(decoder_embed_dim=300, decoder_ffn_embed_dim=1200, decoder_attention_heads=4),
    "wikitext103": dict(decoder_embed_dim=300, decoder_ffn_embed_dim=1200, decoder_attention_heads=6),
    "enwik8": dict(decoder_embed_dim=512, decoder_ffn_embed_dim=2048, decoder_attention_heads=4),
}


def apply_lm_size(args, size):
    """Fill the sizes of LM_SIZES[size] (and 6 layers) that the command line left unset."""
    for name, value in LM_SIZES[size].items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    args.decoder_layers = getattr(args, "decoder_layers", None) or 6


def _register(arch_name, size, variant):
    def architecture(args):
        if variant == "diag_scale" and getattr(args, "diag_scale", None) is None:
            raise ValueError(f"--arch {arch_name} needs --diag-scale C (C > 0)")
        set_attention_defaults(args, **ATTENTION_VARIANTS[variant])
        apply_lm_size(args, size)
        bet_lm_base(args)

    architecture.__name__ = arch_name
    architecture.__doc__ = f"{size} sizes, decoder self-attention: {ATTENTION_VARIANTS[variant]}"
    register_model_architecture("bet_transformer_lm", arch_name)(architecture)


for _size in LM_SIZES:
    _suffix = "" if _size == "wikitext2" else f"_{_size}"
    _register(f"bet_sf_lm{_suffix}", _size, "bet_sf")
    _register(f"bet_sf_nodiagmask_lm{_suffix}", _size, "bet_sf_nodiagmask")
    _register(f"transformer_lm_{_size}", _size, "vanilla")
    for _variant in ("reduced_diag", "magnified_diag", "diag_scale", "diagfree"):
        _register(f"transformer_lm_{_size}_{_variant}", _size, _variant)
