"""bet-fairseq: the Bird-Eye Transformer (BET) as a fairseq plugin (``--user-dir bet_fairseq``).

Importing the package imports neither fairseq nor torch unless fairseq is already loaded, so tools that
only read or write files (``bet-syntax-hints``, ``bet-results``) start fast and leave fairseq untouched.
``bet_fairseq.register()`` (or ``import bet_fairseq.models``) registers everything (attention variants,
models, architectures, criterions, tasks) and applies the fairseq patches of ``bet_fairseq.compat``. It
runs on import when fairseq is loaded already (the case under fairseq's ``--user-dir`` import), and else
when fairseq's ``utils.import_user_module`` is asked for this package: fairseq skips a ``--user-dir``
package that is in ``sys.modules`` already, so without that ``import bet_fairseq`` followed by loading a
checkpoint through fairseq's API would register nothing.
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


class _RegisterOnUserDirImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``fairseq.utils`` loads (after this package), wraps its ``import_user_module``
    so that fairseq's user-dir loading of this package registers it although it is in ``sys.modules``. Tools
    that import fairseq without loading the plugin stay unpatched (tests/compat/test_patch_scope.py)."""

    def find_spec(self, name, path=None, target=None):
        if name != "fairseq.utils":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _register_on_user_dir_import(module)

        spec.loader.exec_module = exec_module
        return spec


def _register_on_user_dir_import(fairseq_utils):
    original = fairseq_utils.import_user_module
    if getattr(original, "_bet_registers", False):
        return

    def import_user_module(args):
        original(args)
        path = getattr(args, "user_dir", None)
        if path is not None and os.path.realpath(path) == os.path.realpath(user_dir()):
            register()

    import_user_module._bet_registers = True
    fairseq_utils.import_user_module = import_user_module


if "fairseq" in sys.modules:
    register()
elif "fairseq.utils" not in sys.modules and not any(isinstance(f, _RegisterOnUserDirImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterOnUserDirImport())
