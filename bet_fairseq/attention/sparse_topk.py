"""Zhao et al. 2019, "Explicit Sparse Transformer": only the top-k logits of each row take part.

In each row of the scaled logits the entries >= the k-th largest allowed one are kept, the rest set
to -inf before the softmax. Ties with the k-th value are all kept (the paper's threshold rule, so a row
may keep more than k); a row with fewer than k allowed keys keeps them all.

The authors' code sparsifies the encoder self-attention (``es``), the decoder self-attention (``ds``)
and the encoder-decoder attention (``dc``) alike; ``--sparse-topk-attention`` picks among them (default:
every one the model has). The decoder self-attention is the registered variant; at the other two sites
(``sites``) it builds ``SparseTopKAttention``.
"""

from dataclasses import dataclass, field
from typing import FrozenSet, Optional

import torch
from fairseq import utils
from fairseq.dataclass import FairseqDataclass
from fairseq.modules.multihead_attention import MultiheadAttention

from ..option_history import option_added
from ..core.baselines import top_k_keep
from ..errors import InputError
from . import SelfAttentionVariant, register_variant
from .sites import CROSS, DECODER_SELF, DESCRIPTIONS, ENCODER_SELF

DEFAULT_SPARSE_TOPK = 8
SITE_CODES = {"es": ENCODER_SELF, "ds": DECODER_SELF, "dc": CROSS}  # the authors' names (--use_att es ds dc)


@dataclass
class SparseTopKOptions(FairseqDataclass):
    sparse_topk: Optional[int] = field(
        default=None,
        metadata={"help": f"sparse_topk: logits kept per row, k >= 1 (default {DEFAULT_SPARSE_TOPK}; "
                          "ties with the k-th are kept)"},
    )
    sparse_topk_attention: Optional[str] = field(
        default="ds",
        metadata={"help": "sparse_topk: the attentions that keep the top k, a comma- or space-separated subset "
                          "of es (encoder self), ds (decoder self), dc (encoder-decoder); default: every one "
                          "the model has, es,ds,dc in translation models (Zhao et al.'s code), ds in language "
                          "models (their only attention: es and dc name nothing there and are ignored)",
                  # checkpoints saved before the option sparsified the decoder self-attention only
                  **option_added("0.2", before="ds")},
    )


def parse_sites(value) -> FrozenSet[str]:
    """The attentions ``--sparse-topk-attention`` names ("es,dc", "es ds dc" or a list), checked."""
    parts = [str(p) for p in value] if isinstance(value, (list, tuple)) else str(value).replace(",", " ").split()
    if not parts:
        raise InputError(f"--sparse-topk-attention: name at least one of {', '.join(SITE_CODES)} (got {value!r})")
    for part in parts:
        if part not in SITE_CODES:
            choices = ", ".join(f"{code} ({DESCRIPTIONS[site]})" for code, site in SITE_CODES.items())
            raise InputError(f"--sparse-topk-attention: {part!r} is not one of {choices} (got {value!r})")
    return frozenset(parts)


def top_k_of(options) -> int:
    """The logits kept per row (``--sparse-topk``, else the default)."""
    return DEFAULT_SPARSE_TOPK if options.sparse_topk is None else options.sparse_topk


@register_variant("sparse_topk", options=SparseTopKOptions)
class SparseTopKSelfAttention(SelfAttentionVariant):
    sites = frozenset(SITE_CODES.values())

    def __init__(self, embed_dim, num_heads, options=None, **kwargs):
        super().__init__(embed_dim, num_heads, options=options, **kwargs)
        self.top_k = top_k_of(self.options)
        self.keeps_top_k = "ds" in parse_sites(self.options.sparse_topk_attention)  # else plain attention here

    @classmethod
    def check_options(cls, options, num_heads):
        k = options.sparse_topk
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise InputError(f"--sparse-topk must be a whole number >= 1 (the logits kept per row), got {k!r}")
        parse_sites(options.sparse_topk_attention)

    @classmethod
    def model_option_defaults(cls, model_sites):
        return {"sparse_topk_attention": ",".join(code for code, site in SITE_CODES.items() if site in model_sites)}

    @classmethod
    def build_site_attention(cls, site, options, embed_dim, num_heads, **mha_kwargs):
        if site not in {SITE_CODES[code] for code in parse_sites(options.sparse_topk_attention)}:
            return None
        return SparseTopKAttention(embed_dim, num_heads, top_k=top_k_of(options), **mha_kwargs)

    def scores(self, q, k, allowed):
        logits = super().scores(q, k, allowed)
        if not self.keeps_top_k:
            return logits
        return logits.masked_fill(~top_k_keep(logits.detach(), allowed, self.top_k), float("-inf"))


class SparseTopKAttention(MultiheadAttention):
    """fairseq's attention keeping each row's top-k logits, for the encoder self-attention and the
    encoder-decoder attention: fairseq's own projections, key/value cache (``static_kv``) and padding
    masks make the logits (``before_softmax``), then the top-k mask, the softmax (float32), dropout and
    ``out_proj``; the weights come back as fairseq returns them."""

    def __init__(self, embed_dim, num_heads, top_k: int = DEFAULT_SPARSE_TOPK, **kwargs):
        super().__init__(embed_dim, num_heads, **kwargs)
        self.top_k = top_k
        # fairseq's fused path (taken without an incremental state) ignores before_softmax; this flag
        # is its documented way out.
        self.skip_embed_dim_check = True

    def extra_repr(self):
        return f"top_k={self.top_k}"

    def forward(self, query, key, value, key_padding_mask=None, incremental_state=None, need_weights=True,
                static_kv=False, attn_mask=None, before_softmax=False, need_head_weights=False):
        need_weights = need_weights or need_head_weights
        tgt_len, bsz, embed_dim = query.size()
        if embed_dim != self.embed_dim:
            raise ValueError(f"query dim {embed_dim} != {self.embed_dim}")
        logits, v = super().forward(query, key, value, key_padding_mask=key_padding_mask,
                                    incremental_state=incremental_state, need_weights=False, static_kv=static_kv,
                                    attn_mask=attn_mask, before_softmax=True)
        logits = logits.masked_fill(~top_k_keep(logits.detach(), None, self.top_k), float("-inf"))
        if before_softmax:
            return logits, v
        probs_float = utils.softmax(logits, dim=-1)
        probs = self.dropout_module(probs_float.type_as(logits))
        kv_bsz = v.size(0) // self.num_heads
        if kv_bsz != bsz:  # fairseq's shared encoder keys under beam search (set_beam_size)
            out = torch.einsum("bxhts,bhsd->bxhtd", probs.view(kv_bsz, -1, self.num_heads, *probs.shape[1:]),
                               v.view(kv_bsz, self.num_heads, *v.shape[1:]))
            out = out.reshape(-1, *out.shape[-2:])
        else:
            out = torch.bmm(probs, v)
        out = self.out_proj(out.transpose(0, 1).contiguous().view(tgt_len, bsz, self.embed_dim))
        weights = None
        if need_weights:
            weights = probs_float.view(bsz, self.num_heads, tgt_len, -1).transpose(1, 0)
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return out, weights
