"""Third-party noise that says nothing about a run, filtered narrowly: each entry names the message and,
where the warning is attributed to a stable module, that module; every other warning is still shown.

Applied by ``compat.install`` (the plugin under fairseq's commands) and by our tools' ``run_tool``.
Why each is safe to hide (docs/quiet_commands.md):

- hydra's deprecation ``UserWarning``s: fairseq 0.12 calls hydra's experimental API; nothing to act on;
- fairseq's "Please install tensorboardX" INFO line, logged when fairseq is imported (by its
  text-to-speech task, whether or not TensorBoard is asked for; ``--tensorboard-logdir`` still says
  itself when tensorboardX is missing);
- hydra's DEBUG "Setting JobRuntime" lines that fairseq-generate's logging shows;
- torch's ``pin_memory`` warning: fairseq's data loaders ask for pinned memory on a CPU-only machine;
- torch's ``torch.cuda.amp`` ``FutureWarning``s, raised by fairseq's calls of the old API;
- numpy's "overflow encountered in scalar subtract" in ``fairseq/data/token_block_dataset.py``: it
  only reaches the ``past_target`` of a one-token block, which no task here uses (docs/quiet_commands.md).

Pure Python: imports neither fairseq nor torch.
"""

import logging
import warnings

__all__ = ["quiet_third_party", "WARNING_FILTERS"]

# (category, message regex, module regex or "" where the warning's module varies)
WARNING_FILTERS = (
    (UserWarning, r"hydra\.experimental\.(initialize|compose)\(\) is no longer experimental", r"hydra\."),
    (UserWarning, r"\s*The version_base parameter is not specified", r"hydra\."),
    (UserWarning, r"In '.*': Usage of deprecated keyword in package header '# @package _group_'", r"hydra\."),
    (UserWarning, r"\s*The strict flag in the compose API is deprecated", r"hydra\."),
    # attributed to whatever frame called fairseq (sys, __main__, a test): the message is hydra's own
    (UserWarning, r"\s*'config' is validated against ConfigStore schema with the same name", ""),
    (UserWarning, r"'pin_memory' argument is set as true but no accelerator is found", r"torch\.utils\.data\."),
    (FutureWarning, r"`torch\.cuda\.amp\.(autocast|GradScaler)\(args\.\.\.\)` is deprecated", r"fairseq\."),
    (RuntimeWarning, r"overflow encountered in scalar subtract", r"fairseq\.data\.token_block_dataset$"),
)
# (logger, start of the message) of log records to drop
LOG_FILTERS = (
    ("fairseq.tasks.text_to_speech", "Please install tensorboardX"),
    ("hydra.core.utils", "Setting JobRuntime:"),  # hydra's DEBUG lines under fairseq-generate
)


class _DropRecords(logging.Filter):
    def __init__(self, start):
        super().__init__()
        self.start = start

    def filter(self, record):
        return not str(record.msg).startswith(self.start)


def quiet_third_party():
    """Install the filters above (idempotent)."""
    for category, message, module in WARNING_FILTERS:
        warnings.filterwarnings("ignore", message, category, module)  # a second call replaces the first
    for name, start in LOG_FILTERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropRecords) and f.start == start for f in logger.filters):
            logger.addFilter(_DropRecords(start))
