"""Routing Transformer language models (Roy et al. 2021), the "Routing Transformer" row of Table 2.

fairseq's TransformerLanguageModel (pre-norm, sinusoidal positions) with every layer's causal
self-attention replaced by ``RoutingMultiheadAttention``: ``--routing-heads`` heads per layer route by
online k-means (``--routing-clusters`` centroids per head, EMA ``--routing-ema-decay``), the other
heads attend to a local window of ``--routing-window`` tokens (default: half the heads each).
Architectures at the sizes of the other LM rows (``LM_SIZES``, 6 layers): ``routing_lm`` (WikiText-2),
``routing_lm_wikitext103``, ``routing_lm_enwik8``; run with ``--task language_modeling``.
"""

from dataclasses import dataclass, field
from typing import Optional

from fairseq.dataclass import FairseqDataclass
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer.transformer_config import TransformerConfig
from fairseq.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig, base_lm_architecture
from fairseq.modules import TransformerDecoderLayer
from fairseq.utils import safe_getattr

from ..cli_help import register_help
from ..modules.routing_attention import RoutingMultiheadAttention, validate_routing_settings
from ..modules.bird_eye_decoder import BirdEyeTransformerDecoder
from .bet_transformer_lm import LM_SIZES, apply_lm_size


@dataclass
class RoutingAttentionConfig(FairseqDataclass):
    routing_clusters: int = field(default=16, metadata={"help": "routing heads: k-means centroids per head"})
    routing_window: int = field(
        default=128, metadata={"help": "local heads: each token sees this many tokens (itself included)"})
    routing_heads: Optional[int] = field(
        default=None, metadata={"help": "routing heads per layer (the rest are local); default: half the heads"})
    routing_ema_decay: float = field(
        default=0.999, metadata={"help": "centroid update: mu <- decay*mu + (1-decay)*mean(assigned), in [0, 1)"})


ROUTING_DEFAULTS = dict(routing_clusters=16, routing_window=128, routing_heads=None, routing_ema_decay=0.999)


def routing_settings(args) -> dict:
    """The module's keyword arguments from a namespace, validated (clear errors on bad values)."""
    heads = safe_getattr(args, "decoder_attention_heads", 8)
    settings = dict(
        num_clusters=safe_getattr(args, "routing_clusters", ROUTING_DEFAULTS["routing_clusters"]),
        window=safe_getattr(args, "routing_window", ROUTING_DEFAULTS["routing_window"]),
        routing_heads=safe_getattr(args, "routing_heads", None),
        ema_decay=safe_getattr(args, "routing_ema_decay", ROUTING_DEFAULTS["routing_ema_decay"]),
    )
    settings["routing_heads"], settings["ema_decay"] = validate_routing_settings(heads, **settings)
    return settings


class RoutingDecoderLayer(TransformerDecoderLayer):
    def __init__(self, args, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        # Read before super().__init__, which builds the self-attention from a TransformerConfig
        # that no longer holds our options.
        self._routing_settings = routing_settings(args)
        super().__init__(args, no_encoder_attn, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)

    def build_self_attention(self, embed_dim, args, add_bias_kv=False, add_zero_attn=False):
        cfg = TransformerConfig.from_namespace(args)
        if cfg.cross_self_attention:
            raise ValueError("--cross-self-attention is not supported by routing attention")
        return RoutingMultiheadAttention(
            embed_dim, cfg.decoder.attention_heads, dropout=cfg.attention_dropout,
            add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn, self_attention=True,
            q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size, **self._routing_settings)


class RoutingTransformerDecoder(BirdEyeTransformerDecoder):
    layer_class = RoutingDecoderLayer


@dataclass
class RoutingLanguageModelConfig(TransformerLanguageModelConfig, RoutingAttentionConfig):
    pass


@register_model("bet_routing_lm", dataclass=RoutingLanguageModelConfig)
class RoutingTransformerLanguageModel(TransformerLanguageModel):
    @classmethod
    def build_model(cls, args, task):
        routing_lm_base(args)
        routing_settings(args)  # fail on bad options before anything is built
        embed_tokens = super().build_model(args, task).decoder.embed_tokens
        return cls(RoutingTransformerDecoder(args, task.target_dictionary, embed_tokens, no_encoder_attn=True))


def routing_lm_base(args):
    for name, value in ROUTING_DEFAULTS.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    base_lm_architecture(args)


def routing_modules(model):
    """The RoutingMultiheadAttention modules of a model, in layer order."""
    return [m for m in model.modules() if isinstance(m, RoutingMultiheadAttention)]


def _register(arch_name, size):
    def architecture(args):
        apply_lm_size(args, size)
        routing_lm_base(args)

    architecture.__name__ = arch_name
    register_model_architecture("bet_routing_lm", arch_name)(architecture)


for _size in LM_SIZES:
    _register("routing_lm" + ("" if _size == "wikitext2" else f"_{_size}"), _size)

register_help("bet-fairseq routing attention (--arch routing_lm[_wikitext103|_enwik8])", RoutingAttentionConfig)
