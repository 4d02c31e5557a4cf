#!/usr/bin/env python
"""Run one row of Table 2 (the same as the console command ``bet-run-row``); see
``python run/table2.py --help`` and docs/data_and_runs.md."""

import sys

from bet_fairseq.tools.results.runner import main

if __name__ == "__main__":
    sys.exit(main())
