"""Adding a row is one catalog entry, adding a dataset one entry (plus its preparation module): in a copy of the
package, a new row and a new dataset appear in ``--arch``, ``bet-run-row``, ``bet-results`` and the study plan
with no other file touched."""

import json
import os
import re
import shutil
import subprocess
import sys

from cli_utils import ROOT

NEW_ENTRIES = '''
_ROW_LIST.append(Row("my_row", "My new row", dict(self_attn_mode="diag_free"), {"my_corpus": 12.5}))
_DATASET_LIST.append(Dataset("my_corpus", "My corpus", "mt", "bleu", IWSLT, "my-prepare --out-dir DATA/mine",
                             recipe="iwslt14_de_en", column="Mine", paper="my_corpus", source="de", target="en",
                             study=True))
ROWS = {r.key: r for r in _ROW_LIST}
DATASETS = {d.key: d for d in _DATASET_LIST}
'''


def copy_with_new_entries(tmp_path):
    package = tmp_path / "bet_fairseq"
    shutil.copytree(os.path.join(ROOT, "bet_fairseq"), package, ignore=shutil.ignore_patterns("__pycache__"))
    catalog = package / "catalog.py"
    text = catalog.read_text()
    # the new entries go right after the tables, before the functions that read them
    anchor = 'ROW_ALIASES = {"transformer": "vanilla"}'
    assert anchor in text
    catalog.write_text(text.replace(anchor, anchor + "\n" + NEW_ENTRIES))
    return tmp_path


def in_copy(root, *argv, check=True):
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=str(root), env=env, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_a_new_row_and_dataset_reach_every_tool(tmp_path):
    root = copy_with_new_entries(tmp_path)
    # --arch: the row's architecture at every size, registered from the one entry
    found = in_copy(root, "-c", "import json, bet_fairseq; bet_fairseq.register(); from fairseq.models import "
                                "ARCH_MODEL_REGISTRY as A; print(json.dumps([bet_fairseq.__file__, sorted(n for n in A "
                                "if n.startswith('my_row'))]))").stdout.strip().splitlines()[-1]
    where, names = json.loads(found)
    assert where.startswith(str(root))
    assert names == ["my_row_iwslt", "my_row_lm", "my_row_lm_enwik8", "my_row_lm_wikitext103", "my_row_wmt_en_de"]
    # bet-run-row: the row on the new dataset, and its usage lists it
    listed = in_copy(root, "-m", "bet_fairseq.tools.results.runner", "--list", "--dataset", "my_corpus").stdout
    assert re.search(r"^my_row\s+my_corpus\s+my_row_iwslt\s", listed, re.M) and "bet_sf_iwslt" in listed
    # bet-results: a result of the new row on the new dataset, in the new column beside the paper's number
    result = tmp_path / "runs" / "result.json"
    result.parent.mkdir()
    result.write_text(json.dumps({"row": "my_row", "dataset": "my_corpus", "metric": "bleu", "value": 11.0,
                                  "setting": "paper"}))
    table = in_copy(root, "-m", "bet_fairseq.tools.results.table", str(result.parent)).stdout
    header = next(line for line in table.splitlines() if line.startswith("| system"))
    assert header.rstrip().endswith("| Mine |")
    assert any(line.startswith("| My new row |") and line.rstrip().endswith("| 11.00 (12.50) |")
               for line in table.splitlines())
    # the study plan: the new dataset is in the default plan, and the new row can be asked for
    plan = in_copy(root, "-m", "bet_fairseq.tools.study.cli", "--scale", "smoke", "--only", "vanilla,my_row",
                   "--dry-run", "--work-dir", str(tmp_path / "work")).stdout
    assert "part my_corpus: 2 runs" in plan and "my_corpus/vanilla x2" in plan
    assert "rows outside the parts: " in plan and "my_corpus/my_row/seed2" in plan
    assert "# my_corpus/my_row/seed1" in plan and "--arch my_row_iwslt" in plan
