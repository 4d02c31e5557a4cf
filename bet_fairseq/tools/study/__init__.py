"""``bet-reproduce``: a seeded, resumable study of the Transformer against BET on Multi30k De-En and
WikiText-2, with its report. From the bottom up: ``plan.py`` the table (rows x datasets x seeds x scales),
``stats.py`` the statistics, ``data.py`` the data preparation, ``machine.py`` the machine and commit a run was made
on, ``commands.py`` a run's fairseq commands, ``store.py`` the run store (folders, records, the archive beside the
report, identical runs), ``derived.py`` the files made from a run's checkpoint, ``runs.py`` one run,
``scheduler.py`` the runs of a sitting, ``decomposition.py`` BET(SF) taken apart, ``report.py`` the report (it only
reads) and ``cli.py`` the command. No module imports one above it. Importing the package imports neither fairseq
nor torch."""
