"""A fairseq TransformerDecoder whose layers use ``BirdEyeMultiheadAttention`` for self-attention.

Only the decoder self-attention changes; the encoder, the encoder-decoder attention and the FFNs
are fairseq's. The layer subclasses fairseq's (legacy, argparse) ``TransformerDecoderLayer``.
"""

from fairseq.models.transformer import TransformerDecoder
from fairseq.models.transformer.transformer_config import TransformerConfig
from fairseq.modules import TransformerDecoderLayer
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.distributed import fsdp_wrap

from .bird_eye_attention import BirdEyeMultiheadAttention
from .bird_eye_config import attention_settings


class BirdEyeDecoderLayer(TransformerDecoderLayer):
    def __init__(self, args, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        # Read before super().__init__, which builds the self-attention.
        self._attention_settings = attention_settings(args)
        super().__init__(args, no_encoder_attn, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)

    def build_self_attention(self, embed_dim, args, add_bias_kv=False, add_zero_attn=False):
        cfg = TransformerConfig.from_namespace(args)
        if cfg.cross_self_attention and self._attention_settings["mode"] != "vanilla":
            raise ValueError("--cross-self-attention is not supported with a BET self-attention mode")
        return BirdEyeMultiheadAttention(
            embed_dim,
            cfg.decoder.attention_heads,
            dropout=cfg.attention_dropout,
            add_bias_kv=add_bias_kv,
            add_zero_attn=add_zero_attn,
            self_attention=not cfg.cross_self_attention,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
            xformers_att_config=cfg.decoder.xformers_att_config,
            **self._attention_settings,
        )


class BirdEyeTransformerDecoder(TransformerDecoder):
    """Subclasses that only change the layer set ``layer_class`` (built from the flat namespace)."""

    layer_class = BirdEyeDecoderLayer

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        # fairseq hands the layer builder a TransformerConfig, which drops our options: the
        # flat namespace (self.args, set before the layers are built) still has them.
        layer = self.layer_class(self.args, no_encoder_attn)
        cfg = TransformerConfig.from_namespace(cfg)
        if cfg.checkpoint_activations:
            layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
        min_params_to_wrap = cfg.min_params_to_wrap if not cfg.checkpoint_activations else 0
        return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


def bird_eye_self_attentions(model):
    """The BirdEyeMultiheadAttention modules of a model, in decoder-layer order."""
    return [m for m in model.modules() if isinstance(m, BirdEyeMultiheadAttention)]
