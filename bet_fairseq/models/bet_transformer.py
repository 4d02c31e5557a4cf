"""Encoder-decoder BET models for translation: fairseq's TransformerModel with the decoder
self-attention replaced (BET_SPEC: "translation: decoder side only").

Architectures (sizes from fairseq's transformer_iwslt_de_en / transformer_wmt_en_de):
``bet_sf_iwslt``, ``bet_sf_wmt_en_de``, ``bet_sf_nodiagmask_{iwslt,wmt_en_de}`` and the
diagonal ablations ``transformer_{iwslt_de_en,wmt_en_de}_{reduced_diag,magnified_diag,
diagfree,diag_scale}``. The vanilla baseline is fairseq's own ``transformer_iwslt_de_en``.
"""

from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (
    TransformerModel,
    transformer_iwslt_de_en,
    transformer_wmt_en_de,
)

from ..modules.bird_eye_config import (
    BirdEyeAttentionConfig,
    attention_settings,
    set_attention_defaults,
)
from ..modules.bird_eye_decoder import BirdEyeTransformerDecoder

# The rows of BET_SPEC Table 2 that change only the decoder self-attention.
ATTENTION_VARIANTS = {
    "bet_sf": dict(self_attn_mode="bet_sf"),
    "bet_sf_nodiagmask": dict(self_attn_mode="bet_sf", bet_keep_diagonal=True),
    "reduced_diag": dict(self_attn_mode="diag_scale", diag_scale=0.2),
    "magnified_diag": dict(self_attn_mode="diag_scale", diag_scale=2.0),
    "diag_scale": dict(self_attn_mode="diag_scale"),
    "diagfree": dict(self_attn_mode="diag_free"),
    "vanilla": dict(self_attn_mode="vanilla"),
}


@register_model("bet_transformer")
class BirdEyeTransformerModel(TransformerModel):
    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        gen_parser_from_dataclass(parser, BirdEyeAttentionConfig(), delete_default=True, with_prefix="")

    @classmethod
    def build_model(cls, args, task):
        bet_transformer_base(args)
        attention_settings(args)  # fail on bad options before anything is built
        return super().build_model(args, task)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return BirdEyeTransformerDecoder(
            args, tgt_dict, embed_tokens, no_encoder_attn=getattr(args, "no_cross_attention", False)
        )


@register_model_architecture("bet_transformer", "bet_transformer")
def bet_transformer_base(args):
    set_attention_defaults(args)
    transformer_wmt_en_de(args)


def _register(arch_name, size_fn, variant):
    def architecture(args):
        if variant == "diag_scale" and getattr(args, "diag_scale", None) is None:
            raise ValueError(f"--arch {arch_name} needs --diag-scale C (C > 0)")
        set_attention_defaults(args, **ATTENTION_VARIANTS[variant])
        size_fn(args)

    architecture.__name__ = arch_name
    architecture.__doc__ = f"{size_fn.__name__} sizes, decoder self-attention: {ATTENTION_VARIANTS[variant]}"
    register_model_architecture("bet_transformer", arch_name)(architecture)


for _size, _size_fn in (("iwslt_de_en", transformer_iwslt_de_en), ("wmt_en_de", transformer_wmt_en_de)):
    _short = "iwslt" if _size == "iwslt_de_en" else _size
    _register(f"bet_sf_{_short}", _size_fn, "bet_sf")
    _register(f"bet_sf_nodiagmask_{_short}", _size_fn, "bet_sf_nodiagmask")
    _register(f"bet_vanilla_{_short}", _size_fn, "vanilla")
    for _variant in ("reduced_diag", "magnified_diag", "diag_scale", "diagfree"):
        _register(f"transformer_{_size}_{_variant}", _size_fn, _variant)
