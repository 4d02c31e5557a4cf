"""bet-fairseq: the Bird-Eye Transformer (BET) as a fairseq plugin (``--user-dir bet_fairseq``).

Importing the package registers its models, architectures, criterions and tasks with fairseq, makes
fairseq checkpoints loadable under torch's ``weights_only`` unpickler, and corrects three faults of
fairseq-fixed 0.12.3.1 on this stack (see distributed_compat and fairseq_compat).
"""

import os

from . import checkpoint_safety, distributed_compat, fairseq_compat

checkpoint_safety.allow_fairseq_checkpoint_globals()  # torch weights_only loading of fairseq checkpoints
distributed_compat.install()  # torchrun (also on CPU): one master, gloo, DDP without device_ids
fairseq_compat.install()  # keep the last batch fairseq-fixed drops; numpy 2's missing np.compat.long

from . import modules, models, criterions, tasks  # noqa: E402,F401  (registers with fairseq)
from .cli_help import add_options_to_fairseq_help, register_help  # noqa: E402
from .modules.bird_eye_config import BirdEyeAttentionConfig  # noqa: E402

register_help(
    "bet-fairseq decoder self-attention (--arch bet_* / transformer_*_diag* of bet_transformer[_lm])",
    BirdEyeAttentionConfig,
)
add_options_to_fairseq_help()

__version__ = "0.1.0"


def user_dir() -> str:
    """The folder to pass as ``--user-dir`` from anywhere."""
    return os.path.dirname(os.path.abspath(__file__))


def print_user_dir():
    print(user_dir())
