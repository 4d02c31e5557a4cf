"""Capture of a model's decoder self-attention: what each layer's ``SelfAttentionVariant`` used in a forward
(per head, before dropout, with gradients), for losses on attention (BET(SG)'s pointer loss) and analysis.

    with capture_attention(model) as captured:
        model(**net_input)
        log_probs = [layer.log_probs for layer in captured.layers()]

Capture is switched on for the ``with`` block only and reset afterwards, exceptions included, so decoding
pays nothing. Plain fairseq decoders (``MultiheadAttention``, whose fused path never exposes per-head
weights) are captured with ``convert=True``: each module is swapped for the ``vanilla`` variant holding the
same weights, which computes the same function on its exact path.
"""

import contextlib
from typing import Iterator, List, NamedTuple, Optional, Sequence, Union

from torch import Tensor, nn

from fairseq.modules.multihead_attention import MultiheadAttention

from .base import SelfAttentionVariant
from .vanilla import VanillaSelfAttention


class CapturedAttention(NamedTuple):
    """What one layer's self-attention recorded in the last forward."""

    probs: Optional[Tensor]  # (B, H, T, S), the weights applied to V
    log_probs: Optional[Tensor]  # their log, float32, computed in log space (losses must not underflow)
    first_pass: Optional[Tensor]  # a variant's intermediate matrix (BET(SF)'s A), else None


class AttentionCapture:
    """The self-attentions being captured, in layer order; ``layers()`` reads what each recorded."""

    def __init__(self, modules: Sequence[SelfAttentionVariant]):
        self.modules = list(modules)

    def __len__(self):
        return len(self.modules)

    def layers(self) -> List[CapturedAttention]:
        return [CapturedAttention(m.captured_attention, m.captured_log_attention, m.captured_first_pass)
                for m in self.modules]

    def clear(self):
        """Forget the last forward's records (so that a forward that records nothing is seen as such)."""
        for m in self.modules:
            m.captured_attention = m.captured_log_attention = m.captured_first_pass = None


@contextlib.contextmanager
def capture_attention(model_or_modules: Union[nn.Module, Sequence[SelfAttentionVariant]],
                      convert: bool = False) -> Iterator[AttentionCapture]:
    """Switch capture on for a model's decoder self-attentions (``decoder_self_attentions``) or for the
    given modules; afterwards restore each module's previous setting and drop the records."""
    if isinstance(model_or_modules, nn.Module):
        modules = decoder_self_attentions(model_or_modules, convert)
    else:
        modules = list(model_or_modules)
    captured = AttentionCapture(modules)
    before = [m.capture_attention for m in modules]
    try:
        for m in modules:
            m.capture_attention = True
        yield captured
    finally:
        for m, was in zip(modules, before):
            m.capture_attention = was
        captured.clear()


def decoder_self_attentions(model, convert: bool = False) -> List[SelfAttentionVariant]:
    """The decoder's self-attention modules in layer order (``model``: an encoder-decoder model, a language
    model or a decoder). ``convert``: swap a fairseq ``MultiheadAttention`` for ``as_capturing_vanilla``'s
    copy in place; otherwise one is an error."""
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
                raise ValueError(f"decoder layer {index}: self_attn is fairseq's MultiheadAttention, which cannot "
                                 "capture its attention")
            attn = as_capturing_vanilla(attn)
            layer.self_attn = attn
        found.append(attn)
    return found


def as_capturing_vanilla(mha: MultiheadAttention) -> SelfAttentionVariant:
    """The ``vanilla`` variant with the weights and settings of ``mha`` (``mha`` itself if it is a variant)."""
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
