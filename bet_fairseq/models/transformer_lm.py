"""Decoder-only language models: fairseq's TransformerLanguageModel with every layer's self-attention
a ``--self-attn-mode`` variant (the paper: every layer of a language model)."""

import dataclasses

from fairseq.models import register_model
from fairseq.models.transformer_lm import DEFAULT_MAX_TARGET_POSITIONS, TransformerLanguageModel, TransformerLanguageModelConfig
from fairseq.utils import safe_getattr

from ..attention import LM_SITES, resolve_attention
from .decoder import VariantTransformerDecoder
from .defaults import lm_defaults
from .options import AttentionConfig, LegacyAttentionConfig, upgrade_legacy_options
from .task_fit import check_task_fits, load_checked
from ..errors import InputError

VariantLanguageModelConfig = dataclasses.make_dataclass(
    "VariantLanguageModelConfig", [], bases=(TransformerLanguageModelConfig, AttentionConfig, LegacyAttentionConfig)
)


@register_model("bet_transformer_lm", dataclass=VariantLanguageModelConfig)
class VariantTransformerLanguageModel(TransformerLanguageModel):
    default_mode = "vanilla"  # the variant of an architecture that names none (``--arch bet_transformer_lm``)

    @classmethod
    def build_model(cls, args, task):
        upgrade_legacy_options(args)
        check_task_fits(args, task, "lm")
        if safe_getattr(args, "self_attn_mode", None) is None:
            args.self_attn_mode = cls.default_mode
        lm_defaults(args)
        # once per model, failing on bad options before anything is built
        attention = resolve_attention(args, args.decoder_attention_heads, LM_SITES)
        if args.decoder_layers_to_keep:
            args.decoder_layers = len(args.decoder_layers_to_keep.split(","))
        if safe_getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = safe_getattr(args, "tokens_per_sample", DEFAULT_MAX_TARGET_POSITIONS)
        if args.character_embeddings or args.adaptive_input:
            raise InputError("--character-embeddings / --adaptive-input are not supported by bet_fairseq's "
                             "language models (plain token embeddings only)")
        embed_tokens = cls.build_embedding(args, task.source_dictionary, args.decoder_input_dim)
        return cls(VariantTransformerDecoder(args, task.target_dictionary, embed_tokens, no_encoder_attn=True,
                                             attention=attention))

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        # a clear line instead of torch's "size mismatch" / "Missing key(s)" over a screen of parameter names
        load = super().load_state_dict
        return load_checked(self, lambda state: load(state, strict, model_cfg, args), state_dict)


@register_model("baseline_transformer_lm", dataclass=VariantLanguageModelConfig)
class LegacyBaselineLanguageModel(VariantTransformerLanguageModel):
    """The model name of version 0.1's localness / sparse_topk / hopfield LM checkpoints."""


@register_model("bet_routing_lm", dataclass=VariantLanguageModelConfig)
class LegacyRoutingLanguageModel(VariantTransformerLanguageModel):
    """The model name of version 0.1's routing LM checkpoints."""

    default_mode = "routing"
