"""Let fairseq checkpoints load under torch >= 2.6 without turning ``weights_only`` off.

torch now unpickles checkpoints with ``weights_only=True``, which refuses any class not on its
allow-list; fairseq checkpoints hold a few plain containers besides tensors (the training
``argparse.Namespace``, omegaconf's config nodes in some versions, numpy scalars in the training
state). We allow exactly those, nothing that executes code on load.
"""

import argparse
import collections
import logging

import torch

logger = logging.getLogger(__name__)


def fairseq_checkpoint_globals():
    allowed = [argparse.Namespace, collections.OrderedDict, collections.defaultdict]
    try:
        import numpy as np

        core = getattr(np, "_core", None) or np.core
        allowed += [np.dtype, core.multiarray.scalar]  # numpy scalars in the training state
        allowed += [type(np.dtype(t)) for t in ("float64", "float32", "int64", "int32", "bool")]
    except ImportError:  # pragma: no cover - numpy comes with fairseq
        pass
    try:
        from omegaconf import DictConfig, ListConfig
        from omegaconf.base import ContainerMetadata, Metadata
        from omegaconf.nodes import AnyNode

        allowed += [DictConfig, ListConfig, ContainerMetadata, Metadata, AnyNode]
    except ImportError:  # pragma: no cover
        pass
    return allowed


def allow_fairseq_checkpoint_globals():
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is None:  # torch < 2.4 loads everything anyway
        return
    add(fairseq_checkpoint_globals())
