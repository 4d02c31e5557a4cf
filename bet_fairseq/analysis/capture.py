"""Moved to ``bet_fairseq.attention.capture`` (``capture_attention``). ``decoder_self_attentions`` stays
here, converting fairseq's own attention as the analysis always did, for the callers that still import it
from here (``study/runs.py``, whose Transformer row is fairseq's own model)."""

from ..attention import capture


def decoder_self_attentions(model, convert: bool = True):
    """``attention.capture.decoder_self_attentions``, converting fairseq's modules unless told not to."""
    return capture.decoder_self_attentions(model, convert)
