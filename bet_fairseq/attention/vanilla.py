"""fairseq's own attention: the Transformer baseline and BET(SG) (which changes only the loss)."""

from fairseq.modules.multihead_attention import MultiheadAttention

from . import SelfAttentionVariant, register_variant


@register_variant("vanilla")
class VanillaSelfAttention(SelfAttentionVariant):
    """Delegates to ``MultiheadAttention.forward`` (fairseq's fused kernels, bit for bit) unless the
    attention must be captured or returned per head, or padding meets fairseq's explicit-softmax path
    (a decoding step, or need_weights), which gives NaN to a query without keys (left padding) that a
    later layer spreads to real positions through 0 * NaN: there the shared path computes the same,
    with zeros for a query without keys."""

    def forward(self, query, key, value, key_padding_mask=None, incremental_state=None, need_weights=True,
                static_kv=False, attn_mask=None, before_softmax=False, need_head_weights=False):
        nan_risk = key_padding_mask is not None and (need_weights or incremental_state is not None)
        if not self.capture_attention and not need_head_weights and not nan_risk:
            return MultiheadAttention.forward(self, query, key, value, key_padding_mask, incremental_state,
                                              need_weights, static_kv, attn_mask, before_softmax, need_head_weights)
        return super().forward(query, key, value, key_padding_mask, incremental_state, need_weights,
                               static_kv, attn_mask, before_softmax, need_head_weights)
