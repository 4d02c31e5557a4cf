"""Task ``bet_truncated_bptt_lm``: contiguous segments for recurrent-memory LMs (Transformer-XL).

Like fairseq's ``examples/truncated_bptt`` (which is not importable here), but every token except the
first of each row is predicted, also across segment boundaries: the split's token stream (the lines
of the binarised file, each ending with </s>, as fairseq's ``language_modeling`` reads them) is cut
into ``--batch-size`` equal rows (the remainder is dropped); batch t holds, for every row, the inputs
``row[t*T : t*T+T]`` and targets ``row[t*T+1 : t*T+T+1]`` with ``T = --tokens-per-sample``. Batches are
never shuffled, so row b of batch t+1 continues row b of batch t, and the model carries its memory
from one batch to the next. ``net_input["segment_index"]`` (0 at the start of a stream) lets the model
reset its memory. Under data parallelism every replica takes its own ``--batch-size`` rows.

Training and evaluation: ``--task bet_truncated_bptt_lm --tokens-per-sample T --batch-size B``; for
``fairseq-eval-lm`` the same flags (``--context-window`` does not apply: the memory is the context).
"""

import logging
import os
from dataclasses import dataclass, field
from typing import Optional

import torch
from omegaconf import II

from fairseq import utils
from fairseq.data import Dictionary, data_utils, iterators
from fairseq.dataclass import FairseqDataclass
from fairseq.tasks import FairseqTask, register_task
from ..errors import InputError

logger = logging.getLogger(__name__)


@dataclass
class TruncatedBPTTConfig(FairseqDataclass):
    data: str = field(default="???", metadata={"help": "folder of fairseq-preprocess --only-source output (dict.txt, SPLIT.bin/.idx)"})
    tokens_per_sample: int = field(default=150, metadata={"help": "segment length T (tokens per row per batch)"})
    batch_size: Optional[int] = II("dataset.batch_size")
    data_parallel_rank: Optional[int] = None
    data_parallel_size: Optional[int] = None


class ContiguousSegments(torch.utils.data.Dataset):
    """Item t: (t, inputs (B, T_t), targets (B, T_t)) of the rows of one replica."""

    def __init__(self, stream: torch.Tensor, rows: int, shard_id: int, num_shards: int, segment: int, name: str):
        total_rows = rows * num_shards
        length = stream.numel() // total_rows
        if length < 2:
            raise InputError(
                f"{name}: {stream.numel()} tokens are too few for {total_rows} rows of at least 2 tokens "
                f"(--batch-size {rows} x {num_shards} replicas); lower --batch-size")
        table = stream[: length * total_rows].view(total_rows, length)
        self.rows = table[shard_id * rows : (shard_id + 1) * rows].contiguous()
        self.segment = segment
        self.num_segments = -(-(length - 1) // segment)

    def __len__(self):
        return self.num_segments

    def __getitem__(self, t):
        start = t * self.segment
        end = min(start + self.segment, self.rows.size(1) - 1)
        return t, self.rows[:, start:end].contiguous(), self.rows[:, start + 1 : end + 1].contiguous()

    @property
    def sizes(self):
        return [self.segment] * self.num_segments


@register_task("bet_truncated_bptt_lm", dataclass=TruncatedBPTTConfig)
class TruncatedBPTTLanguageModelingTask(FairseqTask):
    def __init__(self, cfg: TruncatedBPTTConfig, dictionary: Dictionary):
        super().__init__(cfg)
        self.dictionary = dictionary
        if cfg.batch_size is None or cfg.batch_size < 1:
            raise InputError(f"--task bet_truncated_bptt_lm needs --batch-size N >= 1 (rows per batch), got {cfg.batch_size}")
        if cfg.tokens_per_sample < 1:
            raise InputError(f"--tokens-per-sample must be >= 1, got {cfg.tokens_per_sample}")

    @classmethod
    def setup_task(cls, cfg: TruncatedBPTTConfig, **kwargs):
        paths = utils.split_paths(cfg.data)
        if not paths:
            raise InputError("--task bet_truncated_bptt_lm needs a data folder")
        dict_path = os.path.join(paths[0], "dict.txt")
        if not os.path.exists(dict_path):
            raise FileNotFoundError(f"dictionary not found: {dict_path} (run fairseq-preprocess --only-source)")
        dictionary = Dictionary.load(dict_path)
        logger.info("dictionary: %d types", len(dictionary))
        return cls(cfg, dictionary)

    def _shard(self):
        if self.cfg.data_parallel_rank is not None and self.cfg.data_parallel_size is not None:
            return self.cfg.data_parallel_rank, self.cfg.data_parallel_size
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            from fairseq.distributed import utils as dist_utils

            return dist_utils.get_data_parallel_rank(), dist_utils.get_data_parallel_world_size()
        return 0, 1

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        paths = utils.split_paths(self.cfg.data)
        split_path = os.path.join(paths[(epoch - 1) % len(paths)], split)
        data = data_utils.load_indexed_dataset(split_path, self.dictionary, combine=combine)
        if data is None:
            raise FileNotFoundError(f"dataset not found: {split} ({split_path}.bin / .idx)")
        if len(data) == 0:
            raise InputError(f"{split_path}: the split is empty")
        stream = torch.cat([data[i].long() for i in range(len(data))])
        shard_id, num_shards = self._shard()
        self.datasets[split] = ContiguousSegments(
            stream, self.cfg.batch_size, shard_id, num_shards, self.cfg.tokens_per_sample, split_path)
        logger.info("%s: %d tokens, %d segments of %d x %d", split, stream.numel(),
                    len(self.datasets[split]), self.cfg.batch_size, self.cfg.tokens_per_sample)

    def dataset(self, split):
        if split not in self.datasets:
            raise KeyError(f"dataset not loaded: {split}")
        return self.datasets[split]  # a ContiguousSegments, not a FairseqDataset

    def _collate(self, items):
        assert len(items) == 1, "every item of ContiguousSegments is already a whole batch"
        t, inputs, targets = items[0]
        bsz, length = inputs.shape
        return {
            "id": torch.arange(bsz) + t * bsz,
            "net_input": {
                "src_tokens": inputs,
                "src_lengths": torch.full((bsz,), length, dtype=torch.long),
                "segment_index": torch.tensor(t),
            },
            "target": targets,
            "nsentences": bsz,
            "ntokens": inputs.numel(),
        }

    def get_batch_iterator(self, dataset, num_workers=0, epoch=1, data_buffer_size=0,
                           skip_remainder_batch=False, **kwargs):
        # Our items are whole batches in stream order; fairseq must neither batch nor shuffle them.
        return iterators.EpochBatchIterator(
            dataset=dataset, collate_fn=self._collate, batch_sampler=[[i] for i in range(len(dataset))],
            num_workers=num_workers, epoch=epoch, buffer_size=data_buffer_size, disable_shuffling=True,
            skip_remainder_batch=skip_remainder_batch)

    def eval_lm_dataloader(self, dataset, max_tokens=None, batch_size=None, max_positions=None,
                           num_shards=1, shard_id=0, num_workers=1, data_buffer_size=10, context_window=0):
        if context_window > 0:
            raise ValueError("--context-window does not apply to --task bet_truncated_bptt_lm: the model's "
                             "memory is the context (set it with --model-overrides \"{'mem_len': N}\")")
        return self.get_batch_iterator(dataset, num_workers=num_workers,
                                       data_buffer_size=data_buffer_size).next_epoch_itr(shuffle=False)

    def build_dataset_for_inference(self, src_tokens, src_lengths, **kwargs):
        raise NotImplementedError("bet_truncated_bptt_lm scores contiguous text (fairseq-train / fairseq-eval-lm); "
                                  "it does not generate")

    def max_positions(self):
        return None

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary
