"""Make every decoder self-attention of a loaded model report its attention matrix.

bet_fairseq models already use a ``SelfAttentionVariant``. Plain fairseq checkpoints
(``transformer_iwslt_de_en``, ``transformer_lm`` ...) use fairseq's ``MultiheadAttention``, whose fused
path never exposes per-head weights; those modules are swapped for the ``vanilla`` variant holding the
same weights (``load_state_dict``), which computes the same function on its exact path and can capture.
"""

import contextlib
from typing import List

from fairseq.modules.multihead_attention import MultiheadAttention

from bet_fairseq.attention import SelfAttentionVariant
from bet_fairseq.attention.vanilla import VanillaSelfAttention


def as_capturing_vanilla(mha: MultiheadAttention) -> SelfAttentionVariant:
    """The ``vanilla`` variant with the weights and settings of ``mha``."""
    if isinstance(mha, SelfAttentionVariant):
        return mha
    if not mha.self_attention:
        raise ValueError(
            "decoder self-attention is not plain self-attention (--cross-self-attention?); "
            "its attention cannot be analysed"
        )
    if mha.bias_k is not None or mha.add_zero_attn:
        raise ValueError("decoder self-attention with add_bias_kv/add_zero_attn cannot be analysed")
    if getattr(mha, "use_xformers", False):
        raise ValueError("decoder self-attention built with --decoder-xformers-att-config cannot be analysed")
    new = VanillaSelfAttention(
        mha.embed_dim,
        mha.num_heads,
        dropout=mha.dropout_module.p,
        bias=mha.k_proj.bias is not None,
        self_attention=True,
    )
    new.load_state_dict(mha.state_dict(), strict=True)
    p = next(mha.parameters())
    new.to(device=p.device, dtype=p.dtype)
    new.train(mha.training)
    return new


def decoder_self_attentions(model, convert: bool = True) -> List[SelfAttentionVariant]:
    """The decoder's self-attention modules in layer order, converted in place when needed.

    Works for encoder-decoder models (``model.decoder``) and language models (also ``model.decoder``);
    ``model`` may also be a decoder itself.
    """
    decoder = getattr(model, "decoder", model)
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no decoder.layers; not a fairseq transformer decoder")
    found = []
    for index, layer in enumerate(layers):
        attn = getattr(layer, "self_attn", None)
        if attn is None:
            raise ValueError(f"decoder layer {index} ({type(layer).__name__}) has no self_attn")
        if not isinstance(attn, SelfAttentionVariant):
            if not isinstance(attn, MultiheadAttention):
                raise ValueError(
                    f"decoder layer {index}: self_attn is a {type(attn).__name__}, not a fairseq "
                    "MultiheadAttention; its attention cannot be captured"
                )
            if not convert:
                raise ValueError(f"decoder layer {index}: self_attn is fairseq's MultiheadAttention")
            attn = as_capturing_vanilla(attn)
            layer.self_attn = attn
        found.append(attn)
    return found


@contextlib.contextmanager
def capturing(attentions):
    """Switch capture on for ``attentions`` and restore the previous setting afterwards."""
    before = [a.capture_attention for a in attentions]
    try:
        for a in attentions:
            a.capture_attention = True
        yield attentions
    finally:
        for a, b in zip(attentions, before):
            a.capture_attention = b
            a.captured_attention = None
            a.captured_first_pass = None
            a.captured_log_attention = None
