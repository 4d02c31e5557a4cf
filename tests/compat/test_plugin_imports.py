"""What ``--user-dir bet_fairseq`` imports, and that either import order registers the plugin.

Each case runs in a fresh interpreter: registration is a one-time side effect of importing."""

import json
import os
import subprocess
import sys

from cli_utils import ROOT

FIXTURES = os.path.join(ROOT, "tests", "fixtures", "legacy_v0_1")


def fresh(code: str) -> dict:
    """Run ``code`` in a new interpreter (outside the checkout, so only the installed package is found); it prints
    one JSON line last."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=300,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_user_dir_imports_the_plugin_and_none_of_its_tools():
    found = fresh(
        "import argparse, importlib.util, json, sys\n"
        "from fairseq import utils\n"
        "user_dir = importlib.util.find_spec('bet_fairseq').submodule_search_locations[0]  # found, not imported\n"
        "utils.import_user_module(argparse.Namespace(user_dir=user_dir))\n"
        "from fairseq.models import ARCH_MODEL_REGISTRY\n"
        "print(json.dumps({'modules': sorted(m for m in sys.modules if m.startswith('bet_fairseq')),\n"
        "                  'registered': 'bet_sf_iwslt' in ARCH_MODEL_REGISTRY}))\n")
    assert found["registered"]
    parts = {m.split(".")[1] for m in found["modules"] if "." in m}
    assert {"core", "attention", "models", "criterions", "tasks", "compat"} <= parts, parts
    assert not parts & {"tools", "preprocess", "hf", "recipes", "files"}, parts  # the tools and the integrations


# As a hub user loads a model: fairseq's own user-dir loading, then its checkpoint API.
LOAD = ("import argparse, json\n"
        "from fairseq import checkpoint_utils, utils\n"
        "utils.import_user_module(argparse.Namespace(user_dir=user_dir))\n"
        "models, _, _ = checkpoint_utils.load_model_ensemble_and_task([{path!r}], arg_overrides={{'data': {data!r}}})\n"
        "print(json.dumps({{'model': type(models[0]).__name__}}))\n").format(
    path=os.path.join(FIXTURES, "bet_sf_lm.pt"), data=os.path.join(FIXTURES, "lm"))


def test_import_bet_fairseq_then_fairseqs_user_dir_loading_registers_everything():
    """Version 0.2: the user-dir import skipped the imported package, nothing registered, and loading failed
    with torch's weights_only message."""
    assert fresh("import bet_fairseq\nuser_dir = bet_fairseq.user_dir()\n" + LOAD)["model"] == (
        "VariantTransformerLanguageModel")


def test_fairseq_first_then_its_user_dir_loading_registers_everything():
    code = ("import importlib.util\nimport fairseq\n"
            "user_dir = importlib.util.find_spec('bet_fairseq').submodule_search_locations[0]\n" + LOAD)
    assert fresh(code)["model"] == "VariantTransformerLanguageModel"


def test_importing_the_package_imports_neither_fairseq_nor_torch():
    found = fresh("import json, sys\nimport bet_fairseq, bet_fairseq.catalog, bet_fairseq.recipes\n"
                  "print(json.dumps({'fairseq': 'fairseq' in sys.modules, 'torch': 'torch' in sys.modules}))\n")
    assert found == {"fairseq": False, "torch": False}
