"""Encoder-decoder models for translation: fairseq's TransformerModel with the decoder self-attention
replaced by a ``--self-attn-mode`` variant (the paper: in translation, the decoder only). Zhao et al.'s
top-k may also take the encoder self-attention and the encoder-decoder attention
(``--sparse-topk-attention``; all three by default, as the authors' code)."""

from fairseq.models import register_model
from fairseq.models.transformer import TransformerModel

from ..attention import check_variant
from ..attention.sparse_topk import TRANSLATION_SITES
from .decoder import VariantTransformerDecoder
from .encoder import VariantTransformerEncoder
from .options import AttentionConfig, add_attention_args, upgrade_legacy_options


@register_model("bet_transformer")
class VariantTransformerModel(TransformerModel):
    # fairseq's argparse model: its plugin options, beside fairseq's flags (compat reads the options that
    # older checkpoints lack from the dataclass a model is registered with, or from this one)
    options_dataclass = AttentionConfig

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_attention_args(parser)

    @classmethod
    def build_model(cls, args, task):
        from .architectures import fill, translation_defaults

        upgrade_legacy_options(args)
        translation_defaults(args)
        if args.self_attn_mode == "sparse_topk":
            fill(args, sparse_topk_attention=TRANSLATION_SITES)
        check_variant(args, args.decoder_attention_heads)  # fail on bad options before anything is built
        return super().build_model(args, task)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return VariantTransformerEncoder(args, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return VariantTransformerDecoder(
            args, tgt_dict, embed_tokens, no_encoder_attn=getattr(args, "no_cross_attention", False)
        )


@register_model("baseline_transformer")
class LegacyBaselineTransformerModel(VariantTransformerModel):
    """The model name of version 0.1's localness / sparse_topk / hopfield checkpoints."""
