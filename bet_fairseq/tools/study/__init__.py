"""``bet-reproduce``: a seeded, resumable study of the Transformer against BET on Multi30k De-En and
WikiText-2, with its report. ``plan.py`` holds the table (rows x datasets x seeds x scales),
``data.py`` the data preparation, ``runs.py`` one run, ``stats.py`` the statistics, ``report.py``
the report and ``cli.py`` the command. Importing the package imports neither fairseq nor torch."""
