"""Tasks that add BET(SG) syntax hints to fairseq's translation and language-modelling batches.

``translation_syntax_hints``   fairseq's ``translation`` + ``{split}.hints.{tgt}.bin/.idx``
``language_modeling_syntax_hints``  fairseq's ``language_modeling`` (``--sample-break-mode eos``,
                                    one sentence per sample) + ``{split}.hints.bin/.idx``

The hints (made by ``bet-syntax-hints``) are read from the same data folder as the split and put in
``sample["syntax_hints"]`` (see ``syntax_hint_data``), where the criterion
``label_smoothed_cross_entropy_with_pointer`` reads them.

Hints are needed only to train: they are *required* for the training subset and the validation
subsets (a missing file is an error naming the expected path) and optional for any other split.
Decoding never reads them: ``fairseq-generate`` / ``fairseq-eval-lm`` with a BET(SG) checkpoint run
with the plain ``translation`` / ``language_modeling`` task (fairseq's default task, nothing to pass),
or with these tasks on a split without hint files.
"""

import logging
import os
from dataclasses import dataclass, field

from fairseq import utils
from fairseq.dataclass import FairseqDataclass
from fairseq.tasks import register_task
from fairseq.tasks.language_modeling import LanguageModelingConfig, LanguageModelingTask
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from omegaconf import II

from ..compat import register_help
from ..hint_files import hint_prefix
from .syntax_hint_data import SyntaxHintDataset, check_hint_sizes, load_hint_file

logger = logging.getLogger(__name__)


@dataclass
class SyntaxHintOptions(FairseqDataclass):
    syntax_hints_optional: bool = field(
        default=False,
        metadata={
            "help": "load hint files only where they exist, also for the training/validation subsets "
            "(batches without hints get no pointer loss); by default those subsets require them"
        },
    )
    valid_subset: str = II("dataset.valid_subset")


@dataclass
class TranslationSyntaxHintsConfig(TranslationConfig, SyntaxHintOptions):
    pass


@dataclass
class LanguageModelingSyntaxHintsConfig(LanguageModelingConfig, SyntaxHintOptions):
    train_subset: str = II("dataset.train_subset")


register_help("bet-fairseq syntax hints (--task translation_syntax_hints / language_modeling_syntax_hints)",
              SyntaxHintOptions)


def _hints_required(cfg, split: str) -> bool:
    if cfg.syntax_hints_optional:
        return False
    training_splits = {cfg.train_subset, *str(cfg.valid_subset).split(",")}
    return split in training_splits


def _data_path(cfg, split: str, epoch: int) -> str:
    """The folder fairseq's load_dataset read this split from (sharded train data rotates)."""
    paths = utils.split_paths(cfg.data)
    if split != cfg.train_subset:
        paths = paths[:1]
    return paths[(epoch - 1) % len(paths)]


def _wrap(cfg, dataset, split, epoch, lang, expected_sizes, data_desc, **wrapper_kwargs):
    prefix = hint_prefix(_data_path(cfg, split, epoch), split, lang)
    hints = load_hint_file(prefix, required=_hints_required(cfg, split))
    if hints is None:
        logger.info(f"no syntax hints for {split} ({prefix}.bin): batches carry none")
        return dataset
    check_hint_sizes(hints, expected_sizes, prefix + ".bin", data_desc)
    logger.info(f"loaded {len(hints):,} syntax-hint lines from {prefix}.bin")
    return SyntaxHintDataset(dataset, hints, prefix + ".bin", **wrapper_kwargs)


@register_task("translation_syntax_hints", dataclass=TranslationSyntaxHintsConfig)
class TranslationSyntaxHintsTask(TranslationTask):
    """fairseq's translation task whose training batches carry the target's syntax hints."""

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        dataset = self.datasets[split]
        if dataset.tgt is None:
            return
        self.datasets[split] = _wrap(
            self.cfg, dataset, split, epoch, self.cfg.target_lang, dataset.tgt_sizes,
            f"the {split} target side ({self.cfg.target_lang})",
            pad_idx=self.tgt_dict.pad(), decoder_input_key="prev_output_tokens",
            left_pad=self.cfg.left_pad_target,
        )


@register_task("language_modeling_syntax_hints", dataclass=LanguageModelingSyntaxHintsConfig)
class LanguageModelingSyntaxHintsTask(LanguageModelingTask):
    """fairseq's language_modeling task, one sentence per sample, with the sentences' syntax hints."""

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        super().load_dataset(split, epoch=epoch, combine=combine, **kwargs)
        required = _hints_required(self.args, split)
        if self.args.sample_break_mode != "eos" or self.args.add_bos_token:
            if required:
                raise ValueError(
                    "--task language_modeling_syntax_hints needs --sample-break-mode eos (one sentence "
                    "per sample, as the hints are per line) and no --add-bos-token; got "
                    f"--sample-break-mode {self.args.sample_break_mode}"
                    + (" --add-bos-token" if self.args.add_bos_token else "")
                )
            return
        dataset = self.datasets[split]
        self.datasets[split] = _wrap(
            self.args, dataset, split, epoch, None, dataset.sizes,
            f"the {split} data ({os.path.join(_data_path(self.args, split, epoch), split)})",
            pad_idx=self.dictionary.pad(), decoder_input_key="src_tokens", left_pad=False,
        )
