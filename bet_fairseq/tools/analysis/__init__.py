"""Decoder self-attention analysis (the paper's Table 1 statistics, Table 3 top-k tokens,
heatmaps and bar plots), behind the ``bet-analyze`` console command.

Nothing here is imported when the plugin is loaded (``import bet_fairseq``); matplotlib is
imported only inside the plotting functions.
"""
