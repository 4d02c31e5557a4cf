#!/usr/bin/env python
"""Run one row of Table 2 (the same as the console command ``bet-run-row``); see
``python run/table2.py --help`` and docs/data_and_runs.md."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bet_fairseq.results.runner import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
