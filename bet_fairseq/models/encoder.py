"""fairseq's TransformerEncoder whose layers may take another self-attention: Zhao et al.'s top-k
(``--self-attn-mode sparse_topk`` with ``es`` in ``--sparse-topk-attention``); otherwise fairseq's own,
with the same parameters and outputs."""

from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerEncoder
from fairseq.models.transformer.transformer_config import TransformerConfig
from fairseq.modules.transformer_layer import TransformerEncoderLayerBase
from fairseq.modules.checkpoint_activations import checkpoint_wrapper

from ..attention.sparse_topk import sparse_topk_attention


class VariantEncoderLayer(TransformerEncoderLayerBase):
    def __init__(self, args, return_fc=False):
        self._variant_args = args  # read by build_self_attention, called inside super().__init__
        super().__init__(TransformerConfig.from_namespace(args), return_fc=return_fc)
        del self._variant_args

    def build_self_attention(self, embed_dim, cfg):
        attention = sparse_topk_attention(
            self._variant_args, "es", embed_dim, cfg.encoder.attention_heads, dropout=cfg.attention_dropout,
            self_attention=True, q_noise=self.quant_noise, qn_block_size=self.quant_noise_block_size,
        )
        return attention if attention is not None else super().build_self_attention(embed_dim, cfg)


class VariantTransformerEncoder(TransformerEncoder):
    def build_encoder_layer(self, cfg):
        # fairseq hands the layer builder a TransformerConfig, which drops our options: the flat
        # namespace (self.args, set before the layers are built) still has them.
        layer = VariantEncoderLayer(self.args, return_fc=self.return_fc)
        cfg = TransformerConfig.from_namespace(cfg)
        if cfg.checkpoint_activations:
            layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
        min_params_to_wrap = cfg.min_params_to_wrap if not cfg.checkpoint_activations else 0
        return fsdp_wrap(layer, min_num_params=min_params_to_wrap)
