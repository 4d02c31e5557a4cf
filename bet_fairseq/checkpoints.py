"""Checkpoints that are damaged are refused when loaded, naming the file, before a model uses them.

fairseq loads whatever ``torch.load`` returns: an empty file is a bare ``EOFError``, another file a
``KeyError`` from inside the unpickler, and bytes overwritten inside a tensor's data load silently (NaN
weights that beam search trips over much later). With the plugin loaded (``compat.check_checkpoints``):

- saving (``checkpoint_utils.torch_persistent_save``) records a SHA-256 of the model's state (every
  tensor's name, dtype, shape and bytes; 0.28 s for 42M float32 parameters, the IWSLT model's size, on a
  2-core CPU) in the checkpoint's ``extra_state`` under ``DIGEST_KEY``;
- loading (``checkpoint_utils.load_checkpoint_to_cpu``) refuses, as a ``CheckpointError`` naming the
  file: an empty file, a file torch cannot read (or whose pickle holds more than tensors and plain
  containers: weights-only loading stays on), a state without ``model`` (not a fairseq checkpoint), a
  model state whose digest differs from the recorded one, and any non-finite value in the model's or
  the optimizer's tensors (checkpoints without a digest: other tools', version 0.1's).

A tool that rewrites ``model`` but keeps ``extra_state`` (fairseq's ``scripts/average_checkpoints.py``)
leaves a digest of other weights: the error says so and how to accept the file.
"""

import contextvars
import hashlib
import os

from .errors import InputError, check_writable_folder

DIGEST_KEY = "bet_fairseq_model_sha256"
# fairseq's SinusoidalPositionalEmbedding keeps an uninitialised one-element placeholder (used only for
# its dtype and device), which may hold any bits: not a weight, not checked.
PLACEHOLDER_SUFFIXES = ("._float_tensor",)
_LOADING = contextvars.ContextVar("bet_fairseq_loading_checkpoint", default=None)
# the file the last checkpoint state came from: named by the errors of a model that the state does not fit
LAST_LOADED = contextvars.ContextVar("bet_fairseq_last_loaded_checkpoint", default=None)


class CheckpointError(InputError):
    """A checkpoint file that is damaged or not a fairseq checkpoint; the message names the file."""


def model_digest(model_state) -> str:
    """SHA-256 over a model state dict in its order: each entry's name, dtype, shape and bytes."""
    import torch

    digest = hashlib.sha256()
    for name, value in model_state.items():
        digest.update(name.encode("utf-8") + b"\0")
        if torch.is_tensor(value):
            t = value.detach().cpu().contiguous()
            digest.update(f"{t.dtype}{tuple(t.shape)}".encode() + b"\0")
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        else:
            digest.update(repr(value).encode("utf-8"))
    return digest.hexdigest()


def add_digest(state) -> None:
    """Record the model state's digest in a checkpoint state about to be saved (fairseq's layout)."""
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        extra = state.get("extra_state")
        if extra is None:
            extra = state["extra_state"] = {}
        if isinstance(extra, dict):
            extra[DIGEST_KEY] = model_digest(state["model"])


def _non_finite(tensors):
    """(name, count) of the first floating tensor with a NaN or infinite value, else None."""
    import torch

    for name, t in tensors:
        if name.endswith(PLACEHOLDER_SUFFIXES) or not (torch.is_tensor(t) and t.is_floating_point()):
            continue
        bad = int((~torch.isfinite(t)).sum())
        if bad:
            return name, bad, t.numel()
    return None


def _tensors(obj, prefix=""):
    """(dotted name, tensor) of every tensor inside nested dicts/lists."""
    import torch

    if torch.is_tensor(obj):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _tensors(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{prefix}.{i}" if prefix else str(i))


def verify_state(path, state) -> None:
    """The checks of a loaded checkpoint state (see the module's docstring); raises CheckpointError."""
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        what = f"a {type(state).__name__}" if not isinstance(state, dict) else f"keys {sorted(map(str, state))[:6]}"
        raise CheckpointError(f"{path}: not a fairseq checkpoint (no 'model' state; it holds {what}): "
                              "give a checkpoint_*.pt written by fairseq-train")
    extra = state.get("extra_state")
    recorded = extra.get(DIGEST_KEY) if isinstance(extra, dict) else None
    if recorded is not None and model_digest(state["model"]) != recorded:
        raise CheckpointError(
            f"{path}: its weights differ from the digest recorded when it was saved: the file is damaged "
            "(retrain, or take another checkpoint, e.g. checkpoint_last.pt or an epoch checkpoint); a tool "
            f"that rewrote its weights on purpose should drop extra_state['{DIGEST_KEY}']")
    bad = _non_finite(_tensors(state["model"]))
    where = "model weights"
    if bad is None:
        bad = _non_finite(_tensors(state.get("last_optimizer_state") or {}, "last_optimizer_state"))
        where = "optimizer state"
    if bad is not None:
        name, count, total = bad
        raise CheckpointError(f"{path}: {count} of {total} values of {name} are NaN or infinite ({where}): a "
                              "damaged file or a run that diverged; take another checkpoint")


def check_file(path) -> None:
    """Cheap checks before torch reads the file: it exists and is not empty."""
    if isinstance(path, (str, os.PathLike)) and os.path.isfile(path) and os.path.getsize(path) == 0:
        raise CheckpointError(f"{path}: the checkpoint file is empty (0 bytes: a save or copy that was cut "
                              "short?); take another checkpoint")


def checked_loader(load_checkpoint_to_cpu):
    """``checkpoint_utils.load_checkpoint_to_cpu`` refusing damaged files: errors of ``torch.load`` become a
    CheckpointError naming the file; ``on_loaded`` (called by the upgrade hook, right after ``torch.load``)
    runs ``verify_state`` before fairseq upgrades or uses the state."""

    def wrapper(path, *args, **kwargs):
        check_file(path)
        reached = []
        token = _LOADING.set((path, reached))
        try:
            state = load_checkpoint_to_cpu(path, *args, **kwargs)
            LAST_LOADED.set(path)
            return state
        except (InputError, FileNotFoundError, IsADirectoryError, PermissionError):
            raise
        except Exception as exc:
            if reached:  # torch read the file: the error is fairseq's own or a bug, not the file's
                raise
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            if "Weights only load failed" in str(exc):
                raise CheckpointError(f"{path}: refused: its pickle holds objects other than tensors and plain "
                                      f"containers ({first}); load only checkpoints you trust") from exc
            raise CheckpointError(f"{path}: not a readable checkpoint ({type(exc).__name__}: {first}): a damaged "
                                  "or truncated file, or not a torch checkpoint; take another checkpoint") from exc
        finally:
            _LOADING.reset(token)

    wrapper._bet_checks_checkpoints = True
    wrapper.__wrapped__ = load_checkpoint_to_cpu
    return wrapper


def on_loaded(state) -> None:
    """Called with the state ``torch.load`` returned inside ``load_checkpoint_to_cpu`` (see compat)."""
    loading = _LOADING.get()
    if loading is None:
        return
    path, reached = loading
    reached.append(True)
    verify_state(path, state)


def digesting_saver(torch_persistent_save):
    """``checkpoint_utils.torch_persistent_save`` recording the model digest first (``add_digest``)."""

    def wrapper(obj, *args, **kwargs):
        add_digest(obj)
        return torch_persistent_save(obj, *args, **kwargs)

    wrapper._bet_adds_digest = True
    wrapper.__wrapped__ = torch_persistent_save
    return wrapper


def checked_save_dir(verify):
    """fairseq-train's ``verify_checkpoint_directory`` after a check that names --save-dir (fairseq's own check is
    an OSError traceback: a --save-dir under a file, or not writable)."""

    def verify_checkpoint_directory(save_dir):
        check_writable_folder(save_dir, "--save-dir")
        return verify(save_dir)

    verify_checkpoint_directory._bet_checks_save_dir = True
    return verify_checkpoint_directory
