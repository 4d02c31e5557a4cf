"""Whether an architecture fits the task it is built for, and a checkpoint the model built for it, checked before
anything is built or loaded: fairseq itself builds a language model for translation data (and fails deep inside), a
BET(SG) architecture under the plain translation task (and trains a plain Transformer without a word: BET(SG) is its
task's hints and its criterion's pointer loss), and loads a checkpoint into a model built from another data folder's
dictionary with torch's "size mismatch" over a screen of parameter names."""

import os
import sys

from fairseq.utils import safe_getattr

from ..errors import InputError

HINT_TASKS = {"translation": "translation_syntax_hints", "lm": "language_modeling_syntax_hints"}
EVALUATES = {"fairseq-eval-lm": "lm"}  # commands that take one kind of model only
# fairseq-train (also in process: bet-run-row --in-process, the tests' cli_in_process name it so)
TRAINING_COMMANDS = {"fairseq-train", "fairseq-hydra-train", "fairseq_cli.train", "train.py"}


def task_kind(task):
    """"mt" for fairseq's translation task (and its subclasses), "lm" for its language modelling tasks (and ours),
    None for any other task (not judged here)."""
    from fairseq.tasks.language_modeling import LanguageModelingTask
    from fairseq.tasks.translation import TranslationTask

    from ..tasks.truncated_bptt import TruncatedBPTTLanguageModelingTask

    if isinstance(task, TranslationTask):
        return "mt"
    return "lm" if isinstance(task, (LanguageModelingTask, TruncatedBPTTLanguageModelingTask)) else None


def task_name(task):
    """The --task name fairseq registered ``task``'s class under."""
    from fairseq.tasks import TASK_REGISTRY

    return next((n for n, c in TASK_REGISTRY.items() if c is type(task)), type(task).__name__)


def check_state_fits(model, state_dict):
    """Every parameter of a checkpoint's ``state_dict`` has the shape of ``model``'s: else a CheckpointError that says
    which, and for the embeddings and output projection (rows = dictionary entries) that the data folder differs."""
    from ..checkpoints import LAST_LOADED, CheckpointError

    where = f"{LAST_LOADED.get()}: " if LAST_LOADED.get() else ""
    own = model.state_dict()
    for key, value in state_dict.items():
        if key in own and hasattr(value, "shape") and tuple(value.shape) != tuple(own[key].shape):
            rows_only = value.shape[0] != own[key].shape[0] and tuple(value.shape[1:]) == tuple(own[key].shape[1:])
            if rows_only and ("embed_tokens" in key or "output_projection" in key):
                raise CheckpointError(
                    f"{where}the checkpoint was trained with a dictionary of {value.shape[0]:,} entries ({key}), the "
                    f"data folder's dict*.txt has {own[key].shape[0]:,}: give the data folder the checkpoint was "
                    "trained with (or a copy of its dict*.txt)")
            raise CheckpointError(f"{where}the checkpoint's {key} has shape {tuple(value.shape)}, the model built from "
                                  f"these options {tuple(own[key].shape)}: use the options the checkpoint was trained "
                                  "with")


def load_checked(model, load, state_dict):
    """``load(state_dict)`` (fairseq's ``load_state_dict``) after ``check_state_fits``; torch's "Error(s) in loading
    state_dict" (parameters missing or left over: a checkpoint of another architecture) becomes a CheckpointError."""
    from ..checkpoints import LAST_LOADED, CheckpointError

    check_state_fits(model, state_dict)
    try:
        return load(state_dict)
    except RuntimeError as exc:
        if "Error(s) in loading state_dict" not in str(exc):
            raise
        missing = sorted(set(model.state_dict()) - set(state_dict))
        extra = sorted(set(state_dict) - set(model.state_dict()))
        detail = "; ".join(part for part in (
            f"{len(missing)} parameters missing ({missing[0]} ...)" if missing else "",
            f"{len(extra)} not in this model ({extra[0]} ...)" if extra else "") if part)
        where = f"{LAST_LOADED.get()}: " if LAST_LOADED.get() else ""
        raise CheckpointError(f"{where}the checkpoint holds a model of another architecture or options than the one "
                              f"built here ({detail or exc}): give a checkpoint of the same --arch and options"
                              ) from None


def check_task_fits(args, task, kind):
    """``kind`` ("mt": an encoder-decoder, "lm": a decoder alone) is what the architecture builds."""
    from .. import catalog

    arch = safe_getattr(args, "arch", None) or safe_getattr(args, "_name", None) or "?"
    have = task_kind(task)
    name = task_name(task)
    command = os.path.basename(sys.argv[0]) if sys.argv else ""
    if EVALUATES.get(command, kind) != kind:
        raise InputError(f"--path: the checkpoint holds a translation model (--arch {arch}); {command} scores "
                         "language models: use fairseq-generate")
    if have not in (None, kind):
        want = "a translation task (--task translation, data with dict.SRC.txt and dict.TGT.txt)" if kind == "mt" else \
            "a language-modelling task (--task language_modeling, data made with fairseq-preprocess --only-source)"
        raise InputError(f"--arch {arch} is a {'translation model' if kind == 'mt' else 'language model'}, but --task "
                         f"{name} is {'translation' if have == 'mt' else 'language modelling'}: it needs {want}")
    from ..tasks.syntax_hints import LanguageModelingSyntaxHintsTask, TranslationSyntaxHintsTask

    row = catalog.row_of_arch(arch)
    # decoding a BET(SG) checkpoint under plain --task translation is right (the hints only shape training): the
    # rule holds for training commands alone, which the model builder knows only by the command's name
    if (command in TRAINING_COMMANDS and row is not None and row.needs_syntax_hints
            and not isinstance(task, (TranslationSyntaxHintsTask, LanguageModelingSyntaxHintsTask))):
        wanted = HINT_TASKS["translation" if kind == "mt" else "lm"]
        raise InputError(f"--arch {arch} is BET(SG): it trains with --task {wanted} --criterion "
                         "label_smoothed_cross_entropy_with_pointer (hints from bet-syntax-hints); under --task "
                         f"{name} it would be a plain Transformer")
