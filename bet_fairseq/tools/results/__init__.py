"""Table 2 reproduction: the row table (``rows``), the run driver ``bet-run-row`` (``runner``) and the
results collector ``bet-results`` (``table``, loss curves in ``curves``)."""
