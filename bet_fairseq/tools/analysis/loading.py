"""Load a fairseq checkpoint with its task, and the batches or single sentences to analyse."""

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch

from bet_fairseq.errors import InputError


@dataclass
class LoadedCheckpoint:
    path: str
    model: Any
    cfg: Any
    task: Any
    device: torch.device

    @property
    def is_translation(self) -> bool:
        from fairseq.models import FairseqEncoderDecoderModel

        return isinstance(self.model, FairseqEncoderDecoderModel)

    @property
    def arch(self) -> Optional[str]:
        m = self.cfg.model
        return getattr(m, "arch", None) or getattr(m, "_name", None)

    @property
    def self_attn_mode(self) -> str:
        return getattr(self.cfg.model, "self_attn_mode", None) or "vanilla (fairseq MultiheadAttention)"

    @property
    def decoder_dictionary(self):
        return self.task.target_dictionary


def load_checkpoint(path: str, data: str, overrides: Optional[Dict[str, Any]] = None,
                    cpu: bool = False) -> LoadedCheckpoint:
    """``fairseq.checkpoint_utils.load_model_ensemble_and_task`` with the plugin registered and the
    task's data directory replaced by ``data``; the model is in eval mode on the chosen device."""
    import bet_fairseq
    from fairseq import checkpoint_utils

    bet_fairseq.register()  # the models and tasks, and the patches that make checkpoints loadable
    if not os.path.isfile(path):
        raise InputError(f"checkpoint not found: {path}")
    if not os.path.isdir(data):
        raise InputError(f"data directory not found: {data}")
    arg_overrides = dict(overrides or {})
    arg_overrides["data"] = data
    try:
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides=arg_overrides)
    except FileNotFoundError as exc:  # the checkpoint's task reads a file the data folder lacks (dict.txt ...)
        raise InputError(f"--data {data}: no {os.path.basename(exc.filename or str(exc))}, which the checkpoint's task "
                         "needs: give the data folder the checkpoint was trained with") from None
    model = models[0]
    device = torch.device("cuda" if torch.cuda.is_available() and not cpu else "cpu")
    model.to(device).eval()
    return LoadedCheckpoint(path=path, model=model, cfg=cfg, task=task, device=device)


def load_split(loaded: LoadedCheckpoint, split: str):
    """The task's data set for ``split`` (loaded once)."""
    task = loaded.task
    if split in getattr(task, "datasets", {}):
        return task.datasets[split]
    try:
        task.load_dataset(split)
    except FileNotFoundError as e:
        raise InputError(f"split {split!r} not found in {getattr(task.cfg, 'data', '?')}: {e}") from e
    return task.dataset(split)


def split_batches(loaded: LoadedCheckpoint, split: str, max_tokens: Optional[int] = 4096,
                  batch_size: Optional[int] = None):
    """Batches of ``split`` in dataset order (no shuffling); too-long sentences are skipped by
    fairseq (with a warning). Returns the iterator and the number of sentences in the split."""
    from fairseq import utils

    dataset = load_split(loaded, split)
    task = loaded.task
    itr = task.get_batch_iterator(
        dataset=dataset,
        max_tokens=max_tokens,
        max_sentences=batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), loaded.model.max_positions()),
        ignore_invalid_inputs=True,
        required_batch_size_multiple=1,
        seed=1,
        num_workers=0,
    ).next_epoch_itr(shuffle=False)
    return itr, len(dataset)


# ----------------------------------------------------------------------------------------------
def sample_from_index(loaded: LoadedCheckpoint, split: str, index: int) -> Dict:
    dataset = load_split(loaded, split)
    if not 0 <= index < len(dataset):
        raise InputError(f"sentence index {index} out of range: split {split!r} has {len(dataset)} sentences")
    return dataset.collater([dataset[index]])


def read_text_lines(path: str) -> List[str]:
    if not os.path.isfile(path):
        raise InputError(f"text file not found: {path}")
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def sample_from_text(loaded: LoadedCheckpoint, line: str, where: str = "") -> Dict:
    """A one-sentence teacher-forcing sample from text in the model's own tokenisation (BPE'd like
    its training data). Translation: ``source<TAB>target``; language model: the sentence."""
    task = loaded.task
    tgt_dict = task.target_dictionary
    if loaded.is_translation:
        fields = line.split("\t")
        if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
            raise InputError(f"{where}: a translation model needs 'source<TAB>target', got {line!r}")
        src = task.source_dictionary.encode_line(fields[0], add_if_not_exist=False, append_eos=True).long()
        tgt = tgt_dict.encode_line(fields[1], add_if_not_exist=False, append_eos=True).long()
        prev = torch.cat([tgt.new([tgt_dict.eos()]), tgt[:-1]])
        net_input = {"src_tokens": src.unsqueeze(0), "src_lengths": torch.tensor([src.numel()]),
                     "prev_output_tokens": prev.unsqueeze(0)}
    else:
        if not line.strip():
            raise InputError(f"{where}: empty sentence")
        tgt = tgt_dict.encode_line(line, add_if_not_exist=False, append_eos=True).long()
        src = torch.cat([tgt.new([tgt_dict.eos()]), tgt[:-1]])
        if getattr(task.cfg, "add_bos_token", False):
            src = torch.cat([src.new([tgt_dict.bos()]), src])
            tgt = torch.cat([tgt.new([tgt_dict.pad()]), tgt])
        net_input = {"src_tokens": src.unsqueeze(0), "src_lengths": torch.tensor([src.numel()])}
    return {"id": torch.tensor([0]), "nsentences": 1, "ntokens": int(tgt.numel()),
            "net_input": net_input, "target": tgt.unsqueeze(0)}
