"""The tools around the plugin, which never run inside fairseq-train: the run executor, the Table 2 driver
and results (``results``), the reproduction study (``study``), attention analysis (``analysis``) and figures.
Data preparation and the syntax-hint preprocessor are ``bet_fairseq.preprocess`` (the ``preprocess/`` folder).
``--user-dir bet_fairseq`` imports none of this (tests/compat/test_plugin_imports.py)."""
