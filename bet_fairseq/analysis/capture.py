"""Moved to ``bet_fairseq.attention.capture`` (``capture_attention``); these names stay for the callers
that still import them from here (``study/runs.py``)."""

from ..attention.capture import as_capturing_vanilla, decoder_self_attentions  # noqa: F401
