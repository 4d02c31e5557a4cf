"""Two silent faults of fairseq-fixed 0.12.3.1 on today's stack, corrected on ``import bet_fairseq``.

1. ``fairseq.data.data_utils.batch_by_size`` drops the last batch when its size is not a multiple of
   ``--required-batch-size-multiple`` (default 8). For training that loses a few sentences an epoch; for
   fairseq-generate and fairseq-eval-lm it silently scores a subset of the test set (30 sentences gave 24
   hypotheses). We keep that last batch: the sentences are returned as one final, smaller batch.
2. ``TokenBlockDataset`` (``--sample-break-mode eos``) uses ``np.compat.long``, gone in numpy 2; the
   alias is restored (``np.int64``) only where it is missing.
"""

import types

import numpy as np


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


def install():
    from fairseq.data import data_utils

    if not getattr(data_utils.batch_by_size, "_bet_keeps_last_batch", False):
        data_utils.batch_by_size = _keep_last_batch(data_utils.batch_by_size)
    if not hasattr(np, "compat"):
        np.compat = types.SimpleNamespace(long=np.int64)
    elif not hasattr(np.compat, "long"):
        np.compat.long = np.int64
