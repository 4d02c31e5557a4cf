"""Every patch of fairseq the plugin's command-line use needs, in one place (listed in the README).

``install()`` applies them all; each is narrow (it changes one function and only in the case it
names), idempotent (a second call is a no-op) and applied only by the code that runs fairseq models:
``import bet_fairseq.models`` (which ``--user-dir bet_fairseq`` does) or ``bet_fairseq.register()``.
Tools that do not run models (``bet-syntax-hints``, ``bet-results``) never import this module.

1. ``allow_checkpoint_globals``  torch >= 2.6 unpickles checkpoints with ``weights_only=True``; allow the
   few plain containers fairseq checkpoints hold (``argparse.Namespace``, omegaconf nodes, numpy scalars),
   nothing that executes code; ``weights_only`` stays on.
2. ``patch_distributed``  fairseq 0.12 under ``torchrun`` without GPUs (details below).
3. ``keep_last_batch``  fairseq-fixed 0.12.3.1's ``data_utils.batch_by_size`` drops the last batch when
   its size is not a multiple of ``--required-batch-size-multiple`` (default 8): fairseq-generate and
   fairseq-eval-lm then silently score a subset (30 sentences gave 24 hypotheses). The last batch is kept.
4. ``restore_np_compat_long``  ``TokenBlockDataset`` (``--sample-break-mode eos``) uses ``np.compat.long``,
   gone in numpy 2; the alias (``np.int64``) is restored only where it is missing.
5. ``show_plugin_options_in_help``  fairseq prints ``--help`` during its *first* parse, before any model
   has added its options; only when ``-h``/``--help`` is on the command line, ``parse_args_and_arch`` is
   wrapped to add the plugin's option groups (``register_help``) to the parser it prints.
6. ``upgrade_older_checkpoints``  an option added after a checkpoint was saved is absent from its stored
   model configuration, and an architecture would fill today's default (say the library configuration of
   Hopfield) into a model trained with the earlier behaviour. Before fairseq upgrades a loaded checkpoint
   (``checkpoint_utils._upgrade_state_dict``), ``option_history.fill_options_added`` sets each option that
   the bet_fairseq model's options dataclass declares with ``option_history.option_added(version, before)``
   and that the stored configuration lacks to ``before``, the value that reproduces what the checkpoint was
   trained with. Checkpoints of other models are untouched.
7. ``report_input_errors``  fairseq's commands run the plugin inside their own ``cli_main``, so an
   option error of ours (``--self-attn-layers 9-12`` on 6 layers, ``--pointer-lambda nan``) was the last
   line of a long traceback. ``sys.excepthook`` gets one more case: an uncaught ``errors.InputError`` is
   one line on stderr and exit status 2; every other exception keeps its traceback (``errors``).
8. ``check_checkpoints``  ``load_checkpoint_to_cpu`` refuses an empty, unreadable or non-fairseq file, a
   model whose recorded digest differs and non-finite weights, naming the file; ``torch_persistent_save``
   records the model's digest in ``extra_state`` (``checkpoints``). ``weights_only`` stays on.
9. ``refuse_half_precision_without_device``  ``fairseq-train --fp16`` / ``--amp`` without a CUDA GPU and
   ``--bf16`` without a TPU (fairseq 0.12's ``--bf16`` sets ``--tpu``) crashed inside fairseq (``Torch not
   compiled with CUDA``, ``'NoneType' object has no attribute 'xla_device'``); ``call_main`` of
   fairseq-train first checks for the device and says what to do.
10. ``quiet_third_party_noise``  hydra's deprecation warnings and the other third-party noise listed in
   ``quiet``, each filtered by its message (and module); nothing else is hidden.

Distributed training, in detail. fairseq 0.12 gets three things wrong when launched by ``torchrun``
without GPUs:

a. ``--distributed-world-size`` defaults to ``max(1, torch.cuda.device_count())`` = 1 on CPU, and
   ``infer_init_method`` returns early for a world size of 1, ignoring torchrun's ``WORLD_SIZE`` /
   ``RANK``. Every process then trains alone as rank 0, believes it is the master, and all of them
   write ``checkpoint_last.pt`` (the concurrent rename can crash one of them).
b. Passing ``--distributed-world-size N`` reaches ``_infer_torch_distributed_launch_init``, which
   computes ``device_id = rank % torch.cuda.device_count()``: ZeroDivisionError without GPUs.
c. The ``pytorch_ddp`` wrapper passes ``device_ids=[device_id]`` to ``DistributedDataParallel``,
   which torch rejects for a CPU module; and the default ``nccl`` backend needs CUDA.

With ``WORLD_SIZE``, ``RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` set, the world size and rank come
from torchrun's environment, the device from ``LOCAL_RANK``, and processes are never spawned again. On
CPU (``--cpu`` or no CUDA), ``nccl`` becomes ``gloo`` and DDP gets ``device_ids=None``. Nothing changes
for single-process runs, Slurm, ``--distributed-init-method`` or fairseq's own multi-GPU spawning.
"""

import argparse
import collections
import logging
import os
import sys
import types

import numpy as np
import torch

from .option_history import fill_options_added

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------- distributed
TORCHRUN_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
_DEFAULT_WORLD_SIZE = max(1, torch.cuda.device_count())  # fairseq's default for the flag


def launched_by_torchrun() -> bool:
    return all(os.environ.get(name) for name in TORCHRUN_VARIABLES)


def _positive_int_from_env(name: str, minimum: int) -> int:
    raw = os.environ.get(name)
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise ValueError(f"environment variable {name}={raw!r} is not an integer (set by torchrun?)") from None
    if value < minimum:
        raise ValueError(f"environment variable {name}={value} must be >= {minimum}")
    return value


def apply_torchrun_environment(cfg) -> bool:
    """Fill a DistributedTrainingConfig from torchrun's environment; True when it did."""
    # (`is True`: a bare dataclass holds the unresolved interpolation "${common.tpu}" here.)
    if cfg.distributed_init_method is not None or getattr(cfg, "tpu", False) is True:
        return False
    if getattr(cfg, "pipeline_model_parallel", False) is True or not launched_by_torchrun():
        return False
    world_size = _positive_int_from_env("WORLD_SIZE", 1)
    rank = _positive_int_from_env("RANK", 0)
    if rank >= world_size:
        raise ValueError(f"torchrun environment: RANK={rank} is not below WORLD_SIZE={world_size}")
    local_rank = _positive_int_from_env("LOCAL_RANK", 0) if os.environ.get("LOCAL_RANK") else 0
    given = int(cfg.distributed_world_size)
    if given not in (world_size, _DEFAULT_WORLD_SIZE):
        logger.warning(
            f"--distributed-world-size {given} differs from torchrun's WORLD_SIZE={world_size}; "
            f"using WORLD_SIZE={world_size} (the processes torchrun actually started)"
        )
    cfg.distributed_world_size = world_size
    cfg.distributed_rank = rank
    cfg.device_id = local_rank
    if world_size == 1:
        return True  # a single process: fairseq's plain (non-distributed) path
    cfg.distributed_init_method = "env://"
    cfg.distributed_no_spawn = True  # torchrun already started one process per rank
    if hasattr(cfg, "distributed_num_procs"):
        cfg.distributed_num_procs = 1
    return True


def _wants_cpu(cfg) -> bool:
    common = getattr(cfg, "common", None)
    return bool(getattr(common, "cpu", False)) or not torch.cuda.is_available()


def patch_distributed():
    """torchrun on CPU and GPU: one master, gloo on CPU, DDP without device_ids (idempotent)."""
    from fairseq.distributed import utils as dist_utils
    from fairseq import models as fairseq_models
    from fairseq.models import distributed_fairseq_model as dfm

    if getattr(dist_utils, "_bet_fairseq_patched", False):
        return
    original_infer = dist_utils.infer_init_method
    original_init = dist_utils.distributed_init
    original_wrapper = dfm.DistributedFairseqModel

    def infer_init_method(cfg, force_distributed=False):
        if apply_torchrun_environment(cfg):
            return
        return original_infer(cfg, force_distributed)

    def distributed_init(cfg):
        from argparse import Namespace

        if isinstance(cfg, Namespace):
            from fairseq.dataclass.utils import convert_namespace_to_omegaconf

            cfg = convert_namespace_to_omegaconf(cfg)
        dt = cfg.distributed_training
        if _wants_cpu(cfg) and not cfg.common.tpu and dt.distributed_backend == "nccl":
            logger.warning("--distributed-backend nccl needs CUDA; training on CPU, so using gloo")
            dt.distributed_backend = "gloo"
        return original_init(cfg)

    def DistributedFairseqModel(args, model, process_group, device):
        if torch.device(device).type != "cpu" or args.ddp_backend not in {"c10d", "pytorch_ddp"}:
            return original_wrapper(args, model, process_group, device)
        # torch's DDP takes device_ids=None for CPU modules; the rest is fairseq's branch.
        from torch.nn.parallel import DistributedDataParallel
        from fairseq.distributed import DistributedTimeoutWrapper, ModuleProxyWrapper

        if args.ddp_comm_hook == "fp16":
            raise ValueError("--ddp-comm-hook fp16 is for GPUs; drop it when training on CPU")
        wrapped = DistributedDataParallel(
            module=model.to(device),
            device_ids=None,
            output_device=None,
            broadcast_buffers=args.broadcast_buffers,
            bucket_cap_mb=args.bucket_cap_mb,
            process_group=process_group,
            find_unused_parameters=args.find_unused_parameters,
            gradient_as_bucket_view=args.gradient_as_bucket_view,
        )
        wrapped = ModuleProxyWrapper(wrapped)
        if getattr(args, "heartbeat_timeout", -1) > 0:
            wrapped = DistributedTimeoutWrapper(wrapped, timeout=getattr(args, "heartbeat_timeout", -1))
        return wrapped

    dist_utils.infer_init_method = infer_init_method
    dist_utils.distributed_init = distributed_init
    dfm.DistributedFairseqModel = DistributedFairseqModel
    fairseq_models.DistributedFairseqModel = DistributedFairseqModel  # the trainer's reference
    dist_utils._bet_fairseq_patched = True


# ------------------------------------------------------------------------------- checkpoints
def fairseq_checkpoint_globals():
    allowed = [argparse.Namespace, collections.OrderedDict, collections.defaultdict]
    core = getattr(np, "_core", None) or np.core
    allowed += [np.dtype, core.multiarray.scalar]  # numpy scalars in the training state
    allowed += [np.ndarray, core.multiarray._reconstruct]  # arrays of the --eval-bleu meters
    allowed += [type(np.dtype(t)) for t in ("float64", "float32", "int64", "int32", "bool")]
    try:
        from omegaconf import DictConfig, ListConfig
        from omegaconf.base import ContainerMetadata, Metadata
        from omegaconf.nodes import AnyNode

        allowed += [DictConfig, ListConfig, ContainerMetadata, Metadata, AnyNode]
    except ImportError:  # pragma: no cover - omegaconf comes with fairseq
        pass
    return allowed


def allow_checkpoint_globals():
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:  # torch < 2.4 loads everything anyway
        add(fairseq_checkpoint_globals())


# ------------------------------------------------------------------------------- batches, numpy
def _keep_last_batch(batch_by_size):
    def wrapper(indices, *args, **kwargs):
        batches = batch_by_size(indices, *args, **kwargs)
        if kwargs.get("fixed_shapes") is not None:
            return batches
        indices = np.asarray(indices if isinstance(indices, np.ndarray) else list(indices), dtype=np.int64)
        covered = sum(len(b) for b in batches)
        if covered < len(indices):  # batches keep the order of indices; the dropped tail is the rest
            batches = list(batches) + [indices[covered:]]
        return batches

    wrapper._bet_keeps_last_batch = True
    wrapper.__wrapped__ = batch_by_size
    return wrapper


def keep_last_batch():
    from fairseq.data import data_utils

    if not getattr(data_utils.batch_by_size, "_bet_keeps_last_batch", False):
        data_utils.batch_by_size = _keep_last_batch(data_utils.batch_by_size)


def restore_np_compat_long():
    if not hasattr(np, "compat"):
        np.compat = types.SimpleNamespace(long=np.int64)
    elif not hasattr(np.compat, "long"):
        np.compat.long = np.int64


# ------------------------------------------------------------------------------- older checkpoints
def upgrade_older_checkpoints():
    from fairseq import checkpoint_utils

    original = checkpoint_utils._upgrade_state_dict
    if getattr(original, "_bet_fills_options", False):
        return

    def _upgrade_state_dict(state):
        fill_options_added(state)
        return original(state)

    _upgrade_state_dict._bet_fills_options = True
    checkpoint_utils._upgrade_state_dict = _upgrade_state_dict


# ------------------------------------------------------------------------------- one-line errors, checkpoints
def report_input_errors():
    from . import errors

    errors.install_excepthook()


def check_checkpoints():
    from fairseq import checkpoint_utils

    from . import checkpoints

    if not getattr(checkpoint_utils.load_checkpoint_to_cpu, "_bet_checks_checkpoints", False):
        checkpoint_utils.load_checkpoint_to_cpu = checkpoints.checked_loader(checkpoint_utils.load_checkpoint_to_cpu)
    if not getattr(checkpoint_utils.verify_checkpoint_directory, "_bet_checks_save_dir", False):
        checkpoint_utils.verify_checkpoint_directory = checkpoints.checked_save_dir(
            checkpoint_utils.verify_checkpoint_directory)
    if not getattr(checkpoint_utils.torch_persistent_save, "_bet_adds_digest", False):
        checkpoint_utils.torch_persistent_save = checkpoints.digesting_saver(checkpoint_utils.torch_persistent_save)
    original = checkpoint_utils._upgrade_state_dict  # called with the state torch.load returned
    if not getattr(original, "_bet_verifies_state", False):
        def _upgrade_state_dict(state):
            checkpoints.on_loaded(state)
            return original(state)

        _upgrade_state_dict._bet_verifies_state = True
        checkpoint_utils._upgrade_state_dict = _upgrade_state_dict


# ------------------------------------------------------------------------------- half precision
GPU_HALF_PRECISION = ("fp16", "memory_efficient_fp16", "amp")
TPU_HALF_PRECISION = ("bf16", "memory_efficient_bf16")  # fairseq 0.12: --bf16 sets --tpu (torch_xla)


def half_precision_problem(common):
    """Why fairseq-train cannot train with the half-precision flags of ``common`` here, or None: --fp16,
    --memory-efficient-fp16 and --amp need a CUDA GPU; --bf16 (which fairseq 0.12 turns into --tpu) needs
    torch_xla, i.e. a TPU."""
    import importlib.util

    gpu = [f for f in GPU_HALF_PRECISION if getattr(common, f, False) is True]
    tpu = [f for f in TPU_HALF_PRECISION if getattr(common, f, False) is True]
    if tpu and importlib.util.find_spec("torch_xla") is None:
        flag = "--" + tpu[-1].replace("_", "-")
        return (f"{flag}: fairseq 0.12 trains bfloat16 only on a TPU ({flag} sets --tpu, which needs torch_xla, "
                "not installed here); on a CUDA GPU use --fp16 or --amp, on the CPU drop the flag (float32)")
    if not gpu:
        return None
    flag = "--" + gpu[-1].replace("_", "-")
    if getattr(common, "cpu", False) is True:
        return (f"{flag} with --cpu: fairseq trains in half precision only on a CUDA GPU; drop {flag} to train in "
                "float32 on the CPU")
    if not torch.cuda.is_available():
        return (f"{flag}: fairseq trains in half precision only on a CUDA GPU, and torch sees none here; drop "
                f"{flag} to train in float32 on the CPU")
    return None


def refuse_half_precision_without_device():
    from fairseq.distributed import utils as dist_utils

    from .errors import InputError

    original = dist_utils.call_main
    if getattr(original, "_bet_checks_precision", False):
        return

    def call_main(cfg, main, **kwargs):
        if getattr(main, "__module__", None) == "fairseq_cli.train":  # fairseq-train, fairseq-hydra-train
            problem = half_precision_problem(getattr(cfg, "common", cfg))
            if problem:
                raise InputError(problem)
        return original(cfg, main, **kwargs)

    call_main._bet_checks_precision = True
    dist_utils.call_main = call_main


def quiet_third_party_noise():
    from .quiet import quiet_third_party

    quiet_third_party()


# ------------------------------------------------------------------------------- --help
_HELP_GROUPS = []  # (group title, FairseqDataclass class)


def register_help(title, dataclass_cls):
    """Show ``dataclass_cls``'s options under ``title`` in ``fairseq-* --help`` (once per class)."""
    if all(dc is not dataclass_cls for _, dc in _HELP_GROUPS):
        _HELP_GROUPS.append((title, dataclass_cls))


def show_plugin_options_in_help(argv=None):
    if not any(a in ("-h", "--help") for a in (sys.argv[1:] if argv is None else argv)):
        return
    from fairseq import options
    from fairseq.dataclass.utils import gen_parser_from_dataclass

    original = options.parse_args_and_arch
    if getattr(original, "_bet_help", False):
        return

    def parse_args_and_arch(parser, *args, **kwargs):
        for title, dc in _HELP_GROUPS:
            gen_parser_from_dataclass(parser.add_argument_group(title), dc())
        return original(parser, *args, **kwargs)

    parse_args_and_arch._bet_help = True
    options.parse_args_and_arch = parse_args_and_arch


def install():
    """Apply every patch above (idempotent)."""
    allow_checkpoint_globals()
    patch_distributed()
    keep_last_batch()
    restore_np_compat_long()
    show_plugin_options_in_help()
    upgrade_older_checkpoints()
    report_input_errors()
    check_checkpoints()
    refuse_half_precision_without_device()
    quiet_third_party_noise()
