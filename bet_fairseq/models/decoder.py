"""fairseq's TransformerDecoder with a ``--self-attn-mode`` variant as the self-attention of every layer
(or of the layers ``--self-attn-layers`` names; the others keep vanilla attention).

What each layer builds comes from the model's ``ModelAttention`` (resolved once in ``build_model``): the
variant as the self-attention, and at the encoder-decoder attention whatever the variant puts there
(fairseq's own unless it replaces that site). The layer subclasses fairseq's (legacy, argparse)
``TransformerDecoderLayer``.
"""

from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerDecoder
from fairseq.models.transformer.transformer_config import TransformerConfig
from fairseq.modules import TransformerDecoderLayer
from fairseq.modules.checkpoint_activations import checkpoint_wrapper

from ..attention import CROSS, DECODER_SELF, ModelAttention
from .options import parse_layers
from ..errors import InputError


class VariantDecoderLayer(TransformerDecoderLayer):
    def build_self_attention(self, embed_dim, args, add_bias_kv=False, add_zero_attn=False):
        cfg = TransformerConfig.from_namespace(args)
        if cfg.cross_self_attention:
            raise InputError("--cross-self-attention is not supported by bet_fairseq's decoder self-attention")
        mha_kwargs = dict(
            dropout=cfg.attention_dropout,
            add_bias_kv=add_bias_kv,
            add_zero_attn=add_zero_attn,
            self_attention=True,
            q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
        )
        if not self._uses_variant:  # outside --self-attn-layers: the Transformer's attention
            return self._attention.build_vanilla_self_attention(embed_dim, cfg.decoder.attention_heads, **mha_kwargs)
        return self._attention.build(DECODER_SELF, embed_dim, cfg.decoder.attention_heads, **mha_kwargs)

    def build_encoder_attention(self, embed_dim, args):
        cfg = TransformerConfig.from_namespace(args)
        attention = self._attention.build(
            CROSS, embed_dim, cfg.decoder.attention_heads, kdim=cfg.encoder.embed_dim, vdim=cfg.encoder.embed_dim,
            dropout=cfg.attention_dropout, encoder_decoder_attention=True, q_noise=self.quant_noise,
            qn_block_size=self.quant_noise_block_size,
        )
        return attention if attention is not None else super().build_encoder_attention(embed_dim, args)

    def __init__(self, args, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False, *,
                 attention: ModelAttention, uses_variant=True):
        # read by build_self_attention and build_encoder_attention, called inside super().__init__
        self._attention, self._uses_variant = attention, uses_variant
        super().__init__(args, no_encoder_attn, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
        del self._attention, self._uses_variant


class VariantTransformerDecoder(TransformerDecoder):
    """``--self-attn-layers`` picks the layers that get the variant; the others keep vanilla attention."""

    def __init__(self, args, *rest, attention: ModelAttention, **kwargs):
        # read by build_decoder_layer, called inside super().__init__ (plain attributes: nn.Module accepts
        # them before its own __init__)
        self._attention = attention
        self._variant_layers = parse_layers(getattr(args, "self_attn_layers", None), args.decoder_layers)
        self._layers_built = []
        super().__init__(args, *rest, **kwargs)
        del self._attention, self._variant_layers, self._layers_built

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        # fairseq hands the layer builder a TransformerConfig, which drops our options: the flat
        # namespace (self.args, set before the layers are built) still has them.
        index = len(self._layers_built)  # fairseq builds the layers in order
        self._layers_built.append(index)
        layer = VariantDecoderLayer(self.args, no_encoder_attn, attention=self._attention,
                                    uses_variant=index in self._variant_layers)
        cfg = TransformerConfig.from_namespace(cfg)
        if cfg.checkpoint_activations:
            layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
        min_params_to_wrap = cfg.min_params_to_wrap if not cfg.checkpoint_activations else 0
        return fsdp_wrap(layer, min_num_params=min_params_to_wrap)

