"""fairseq's TransformerDecoder with a ``--self-attn-mode`` variant as every layer's self-attention.

Only the decoder self-attention changes; the encoder, the encoder-decoder attention and the FFNs are
fairseq's. The layer subclasses fairseq's (legacy, argparse) ``TransformerDecoderLayer``.
"""

from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerDecoder
from fairseq.models.transformer.transformer_config import TransformerConfig
from fairseq.modules import TransformerDecoderLayer
from fairseq.modules.checkpoint_activations import checkpoint_wrapper

from ..attention import SelfAttentionVariant, build_variant


class VariantDecoderLayer(TransformerDecoderLayer):
    def build_self_attention(self, embed_dim, args, add_bias_kv=False, add_zero_attn=False):
        cfg = TransformerConfig.from_namespace(args)
        if cfg.cross_self_attention:
            raise ValueError("--cross-self-attention is not supported by bet_fairseq's decoder self-attention")
        return build_variant(
            self._variant_args,
            embed_dim,
            cfg.decoder.attention_heads,
            dropout=cfg.attention_dropout,
            add_bias_kv=add_bias_kv,
            add_zero_attn=add_zero_attn,
            self_attention=True,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
        )

    def __init__(self, args, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        self._variant_args = args  # read by build_self_attention, called inside super().__init__
        super().__init__(args, no_encoder_attn, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
        del self._variant_args


class VariantTransformerDecoder(TransformerDecoder):
    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        # fairseq hands the layer builder a TransformerConfig, which drops our options: the flat
        # namespace (self.args, set before the layers are built) still has them.
        layer = VariantDecoderLayer(self.args, no_encoder_attn)
        cfg = TransformerConfig.from_namespace(cfg)
        if cfg.checkpoint_activations:
            layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
        min_params_to_wrap = cfg.min_params_to_wrap if not cfg.checkpoint_activations else 0
        return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


def self_attention_modules(model):
    """The decoder's ``SelfAttentionVariant`` modules, in layer order."""
    return [m for m in model.modules() if isinstance(m, SelfAttentionVariant)]
