"""Make fairseq's distributed training work under ``torchrun`` on CPU-only (and GPU) machines.

fairseq 0.12 gets three things wrong when launched by ``torchrun`` without GPUs:

1. ``--distributed-world-size`` defaults to ``max(1, torch.cuda.device_count())`` = 1 on CPU, and
   ``infer_init_method`` returns early for a world size of 1, ignoring torchrun's ``WORLD_SIZE`` /
   ``RANK``. Every process then trains alone as rank 0, believes it is the master, and all of them
   write ``checkpoint_last.pt`` (the concurrent rename can crash one of them).
2. Passing ``--distributed-world-size N`` reaches ``_infer_torch_distributed_launch_init``, which
   computes ``device_id = rank % torch.cuda.device_count()``: ZeroDivisionError without GPUs.
3. The ``pytorch_ddp`` wrapper passes ``device_ids=[device_id]`` to ``DistributedDataParallel``,
   which torch rejects for a CPU module; and the default ``nccl`` backend needs CUDA.

The patches below (applied on ``import bet_fairseq``) make torchrun's environment authoritative:
with ``WORLD_SIZE``, ``RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` set, the world size and rank come
from it, the device from ``LOCAL_RANK``, and processes are never spawned again. On CPU (``--cpu``
or no CUDA), ``nccl`` becomes ``gloo`` and DDP gets ``device_ids=None``. Nothing changes for
single-process runs, Slurm, ``--distributed-init-method`` or fairseq's own multi-GPU spawning.
"""

import logging
import os

import torch

logger = logging.getLogger(__name__)

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


def install():
    """Patch fairseq's distributed utilities once (idempotent)."""
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
