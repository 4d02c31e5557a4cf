"""The attention sites of a model that a variant may replace: a model declares the sites it has, a variant
the sites it replaces (``SelfAttentionVariant.sites``), so that models name no variant."""

DECODER_SELF = "decoder_self"  # the causal decoder self-attention: the variant class itself
ENCODER_SELF = "encoder_self"  # the encoder self-attention (translation models)
CROSS = "cross"  # the encoder-decoder attention (translation models)

TRANSLATION_SITES = frozenset({ENCODER_SELF, DECODER_SELF, CROSS})
LM_SITES = frozenset({DECODER_SELF})
DESCRIPTIONS = {ENCODER_SELF: "encoder self-attention", DECODER_SELF: "decoder self-attention",
                CROSS: "encoder-decoder attention"}
