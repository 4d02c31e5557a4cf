"""Encoder-decoder models for translation: fairseq's TransformerModel with the decoder self-attention
replaced by a ``--self-attn-mode`` variant (the paper: in translation, the decoder only). A variant may
also replace the encoder self-attention and the encoder-decoder attention (its ``sites``; Zhao et al.'s
top-k does, as the authors' code)."""

import contextvars

from fairseq.models import register_model
from fairseq.models.transformer import TransformerModel

from ..attention import TRANSLATION_SITES, resolve_attention
from .decoder import VariantTransformerDecoder
from .defaults import translation_defaults
from .encoder import VariantTransformerEncoder
from .options import AttentionConfig, add_attention_args, upgrade_legacy_options
from .task_fit import check_task_fits, load_checked

# The attention that build_model resolved for the model being built: fairseq's build_model calls
# build_encoder and build_decoder itself, with nothing but the configuration.
_BEING_BUILT = contextvars.ContextVar("bet_fairseq_attention_being_built", default=None)


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
        upgrade_legacy_options(args)
        check_task_fits(args, task, "mt")
        translation_defaults(args)
        # once per model, failing on bad options before anything is built
        token = _BEING_BUILT.set(resolve_attention(args, args.decoder_attention_heads, TRANSLATION_SITES))
        try:
            return super().build_model(args, task)
        finally:
            _BEING_BUILT.reset(token)

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        # a clear line instead of torch's "size mismatch" / "Missing key(s)" over a screen of parameter names
        load = super().load_state_dict
        return load_checked(self, lambda state: load(state, strict, model_cfg, args), state_dict)

    @classmethod
    def _attention_being_built(cls, args):
        """The attention of the model being built (resolved here when fairseq's builders run on their own)."""
        return _BEING_BUILT.get() or resolve_attention(args, args.decoder_attention_heads, TRANSLATION_SITES)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return VariantTransformerEncoder(args, src_dict, embed_tokens, attention=cls._attention_being_built(args))

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return VariantTransformerDecoder(
            args, tgt_dict, embed_tokens, no_encoder_attn=getattr(args, "no_cross_attention", False),
            attention=cls._attention_being_built(args),
        )


@register_model("baseline_transformer")
class LegacyBaselineTransformerModel(VariantTransformerModel):
    """The model name of version 0.1's localness / sparse_topk / hopfield checkpoints."""
