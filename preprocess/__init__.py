"""Data preparation for bet-fairseq: console commands that prepare corpora and BET(SG) syntax hints
(``bet-syntax-hints``, see ``syntax_hints``)."""
