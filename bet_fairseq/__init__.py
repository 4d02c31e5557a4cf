"""bet-fairseq: the Bird-Eye Transformer (BET) as a fairseq plugin (``--user-dir bet_fairseq``).

Importing the package registers its models, architectures, criterions and tasks with fairseq and
makes fairseq checkpoints loadable under torch's ``weights_only`` unpickler.
"""

import os

from . import checkpoint_safety

checkpoint_safety.allow_fairseq_checkpoint_globals()

from . import modules, models  # noqa: E402,F401  (registers with fairseq)

__version__ = "0.1.0"


def user_dir() -> str:
    """The folder to pass as ``--user-dir`` from anywhere."""
    return os.path.dirname(os.path.abspath(__file__))


def print_user_dir():
    print(user_dir())
