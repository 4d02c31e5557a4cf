"""bet-fairseq: the Bird-Eye Transformer (BET) as a fairseq plugin (``--user-dir bet_fairseq``).

Importing the package imports neither fairseq nor torch unless fairseq is already loaded, so tools that
only read or write files (``bet-syntax-hints``, ``bet-results``) start fast and leave fairseq untouched.
``bet_fairseq.register()`` (or ``import bet_fairseq.models``) registers everything (attention variants,
models, architectures, criterions, tasks) and applies the fairseq patches of ``bet_fairseq.compat``. It
runs on import when fairseq is loaded already, which is the case under fairseq's ``--user-dir`` import:
fairseq skips a ``--user-dir`` package that is imported already, so registration cannot wait for it.
"""

import os
import sys

__version__ = "0.2.0"


def register():
    """Register the plugin with fairseq and apply its patches (idempotent), as ``--user-dir`` does."""
    from . import models  # noqa: F401


def user_dir() -> str:
    """The folder to pass as ``--user-dir`` from anywhere."""
    return os.path.dirname(os.path.abspath(__file__))


def print_user_dir():
    print(user_dir())


if "fairseq" in sys.modules:
    register()
