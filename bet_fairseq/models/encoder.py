"""fairseq's TransformerEncoder whose layers take the self-attention the model's variant puts at the
encoder self-attention site (``ModelAttention``); fairseq's own, with the same parameters and outputs,
when the variant does not replace it."""

from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerEncoder
from fairseq.models.transformer.transformer_config import TransformerConfig
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase
from fairseq.modules.checkpoint_activations import checkpoint_wrapper

from ..attention import ENCODER_SELF, ModelAttention


class VariantEncoderLayer(TransformerEncoderLayerBase):
    def __init__(self, args, return_fc=False, *, attention: ModelAttention):
        self._attention = attention  # read by build_self_attention, called inside super().__init__
        super().__init__(TransformerConfig.from_namespace(args), return_fc=return_fc)
        del self._attention

    def build_self_attention(self, embed_dim, cfg):
        attention = self._attention.build(
            ENCODER_SELF, embed_dim, cfg.encoder.attention_heads, dropout=cfg.attention_dropout,
            self_attention=True, q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size,
        )
        return attention if attention is not None else super().build_self_attention(embed_dim, cfg)


class VariantTransformerEncoder(TransformerEncoder):
    def __init__(self, args, *rest, attention: ModelAttention, **kwargs):
        self._attention = attention  # read by build_encoder_layer, called inside super().__init__
        super().__init__(args, *rest, **kwargs)
        del self._attention

    def build_encoder_layer(self, cfg):
        layer = VariantEncoderLayer(self.args, return_fc=self.return_fc, attention=self._attention)
        cfg = TransformerConfig.from_namespace(cfg)
        if cfg.checkpoint_activations:
            layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
        min_params_to_wrap = cfg.min_params_to_wrap if not cfg.checkpoint_activations else 0
        return fsdp_wrap(layer, min_num_params=min_params_to_wrap)
