"""What a batch of BET(SG) holds for its pointer loss: shared by the task that fills it
(``tasks/syntax_hint_data.py``) and the criterion that reads it, neither of which imports the other."""

SYNTAX_HINTS = "syntax_hints"  # the sample's key: (B, T) hinted positions, aligned with the decoder input
HINT_PAD = -1  # a position without a hint (padding)
