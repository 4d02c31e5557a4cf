#!/usr/bin/env python
"""Write ``run/<dataset>/<row>.sh`` for every (row, dataset) of ``bet_fairseq/results/rows.py``.

Each script is a thin wrapper of run/table2.py (= ``bet-run-row``) so that all rows share one driver:

    run/iwslt14_de_en/bet_sf.sh DATA_BIN SAVE_DIR [--quick] [other bet-run-row options] [-- fairseq-train args]
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from bet_fairseq.results import rows as R  # noqa: E402

TEMPLATE = """#!/usr/bin/env bash
# Table 2 row "{label}" on {column} ({dataset}), --arch {arch}.
# Data: {prepare}
# Usage: {path} DATA_BIN SAVE_DIR [--quick] [bet-run-row options] [-- extra fairseq-train args]
# (written by run/make_scripts.py from bet_fairseq/results/rows.py; edit the row table, not this file)
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 DATA_BIN SAVE_DIR [--quick] [bet-run-row options] [-- fairseq-train args]" >&2
    exit 2
fi
data="$1"; save="$2"; shift 2
exec "${{PYTHON:-python}}" "$(dirname "$0")/../table2.py" --row {row} --dataset {dataset} --data "$data" --save-dir "$save" "$@"
"""


def scripts():
    for row in R.ROWS:
        for dataset, arch in row.archs.items():
            ds = R.DATASETS[dataset]
            rel = f"run/{dataset}/{row.key}.sh"
            yield rel, TEMPLATE.format(label=row.label, column=ds.column, dataset=dataset, arch=arch,
                                       prepare=ds.prepare, path=rel, row=row.key)


def main():
    root = os.path.dirname(HERE)
    n = 0
    for rel, text in scripts():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(path, 0o755)
        n += 1
    print(f"wrote {n} scripts under run/")


if __name__ == "__main__":
    main()
