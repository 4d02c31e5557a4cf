"""bet-fairseq: the Bird-Eye Transformer (BET) as a fairseq plugin (``--user-dir bet_fairseq``).

Importing the package imports neither fairseq nor torch unless fairseq is already loaded, so tools that
only read or write files (``bet-syntax-hints``, ``bet-results``) start fast and leave fairseq untouched.
``bet_fairseq.register()`` (or ``import bet_fairseq.models``) registers everything (attention variants,
models, architectures, criterions, tasks) and applies the fairseq patches of ``bet_fairseq.compat``. It
runs on import when fairseq is loaded already (the case under fairseq's ``--user-dir`` import), and else
as soon as fairseq is imported: fairseq's ``utils.import_user_module`` skips a ``--user-dir`` package that is
in ``sys.modules`` already, so registration can wait for neither order (``import bet_fairseq`` then
loading a checkpoint through fairseq's API, or the reverse).
"""

import importlib.abc
import importlib.util
import os
import sys

__version__ = "0.3.0"


def register():
    """Register the plugin with fairseq and apply its patches (idempotent), as ``--user-dir`` does."""
    from . import models  # noqa: F401


def user_dir() -> str:
    """The folder to pass as ``--user-dir`` from anywhere."""
    return os.path.dirname(os.path.abspath(__file__))


def print_user_dir():
    print(user_dir())


class _RegisterWhenFairseqLoads(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``fairseq`` is imported, lets its own loader run, then registers."""

    def find_spec(self, name, path=None, target=None):
        if name != "fairseq":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            register()

        spec.loader.exec_module = exec_module
        return spec


if "fairseq" in sys.modules:
    register()
elif not any(isinstance(f, _RegisterWhenFairseqLoads) for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterWhenFairseqLoads())
