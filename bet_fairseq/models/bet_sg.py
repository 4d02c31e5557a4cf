"""BET(SG) architectures: the vanilla transformer, trained with the syntax pointer loss.

BET(SG) changes no parameter: the paper's model is the vanilla transformer whose decoder
self-attention is pushed toward each position's syntax hint by the loss
``label_smoothed_cross_entropy_with_pointer`` (BET_SPEC section 3). These architectures are the
``bet_transformer`` / ``bet_transformer_lm`` models with ``--self-attn-mode vanilla``: their
decoder self-attention is ``BirdEyeMultiheadAttention``, whose per-head matrix the criterion
captures during training, while decoding takes fairseq's fused path at no extra cost.
(DiagFreeMask / BET(SF) modes would give A_tt = 0 where a hint points at t itself, log 0.)

``bet_sg_iwslt`` (transformer_iwslt_de_en sizes), ``bet_sg_wmt_en_de`` (transformer_wmt_en_de sizes),
``bet_sg_lm`` (WikiText-2 sizes), ``bet_sg_lm_wikitext103``, ``bet_sg_lm_enwik8``.
"""

from fairseq.models.transformer import transformer_iwslt_de_en, transformer_wmt_en_de

from . import bet_transformer, bet_transformer_lm

bet_transformer._register("bet_sg_iwslt", transformer_iwslt_de_en, "vanilla")
bet_transformer._register("bet_sg_wmt_en_de", transformer_wmt_en_de, "vanilla")
for _size in bet_transformer_lm.LM_SIZES:
    bet_transformer_lm._register("bet_sg_lm" + ("" if _size == "wikitext2" else f"_{_size}"), _size, "vanilla")
