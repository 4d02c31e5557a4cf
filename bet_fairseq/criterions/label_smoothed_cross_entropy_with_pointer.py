"""BET(SG)'s training loss: label-smoothed cross-entropy plus the syntax pointer loss.

The paper's equation 5 (Sha et al. 2022, section 3): each decoder block's self-attention ``A`` is asked to point at the
syntax hint of every position, ``L_p = - sum_t log A[t, hint_t]``; the blocks' losses are summed,
weighted by ``--pointer-lambda`` and added to the token loss:

    loss = label_smoothed_nll + pointer_lambda * sum_blocks sum_{non-pad t} -log A_block[t, hint_t]

Normalisation: ``L_p`` is summed over the same non-pad target positions as the token loss, so both
are divided by the same sample size (target tokens) in the gradient, and ``pointer_loss`` is logged
like ``loss``: per target token, in base 2 (summed over blocks, before ``pointer_lambda``).
``loss`` in the log includes ``pointer_lambda * L_p``; ``nll_loss`` / ``ppl`` are the token loss only.

``A`` is read from the decoder's ``SelfAttentionVariant`` modules (``capture_attention``, per
head, with gradients), switched on for this forward only: decoding pays nothing.
``--pointer-heads``: ``mean`` puts the loss on the head-averaged distribution (the layer's attention
matrix as fairseq reports it; ``-log`` of the head mean is 0 only when every head puts all its mass on
the hint), ``first`` on head 0 of each layer only (the other heads stay free), ``all`` on every head
(the per-head losses averaged over heads). The defaults are ``catalog.POINTER_DEFAULT``.
With ``--pointer-lambda 0`` (or a batch without hints) this is exactly
``label_smoothed_cross_entropy``.
"""

import logging
import math
from dataclasses import dataclass, field

import torch

from fairseq import utils
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.logging import metrics

from ..attention.capture import capture_attention, decoder_self_attentions
from ..catalog import POINTER_DEFAULT
from ..compat import register_help
from ..syntax_hint_batch import HINT_PAD, SYNTAX_HINTS
from ..errors import InputError

logger = logging.getLogger(__name__)

POINTER_HEADS = ("mean", "first", "all")


@dataclass
class PointerLossOptions(FairseqDataclass):
    pointer_lambda: float = field(
        default=POINTER_DEFAULT["pointer_lambda"],
        metadata={"help": "lambda_p: weight of the syntax pointer loss (summed over decoder blocks); "
                          "0 = plain label_smoothed_cross_entropy"},
    )
    pointer_heads: ChoiceEnum(list(POINTER_HEADS)) = field(
        default=POINTER_DEFAULT["pointer_heads"],
        metadata={"help": "which attention takes the pointer loss: mean (head-averaged distribution of "
                          "each layer), first (head 0 of each layer), all (every head, averaged)"},
    )


@dataclass
class LabelSmoothedCrossEntropyWithPointerConfig(LabelSmoothedCrossEntropyCriterionConfig, PointerLossOptions):
    pass


register_help("bet-fairseq BET(SG) pointer loss (--criterion label_smoothed_cross_entropy_with_pointer)",
              PointerLossOptions)


def pointer_loss(log_attentions, hints, heads: str = "mean"):
    """sum over blocks and non-pad positions of -log A[t, hint_t], computed in log space.

    log_attentions: per block, (B, H, T, S) log-probabilities (captured ``log_probs``);
    hints: (B, T), ``HINT_PAD`` where padded. ``mean`` takes -log of the head-averaged probability,
    ``logsumexp_h(log A_h) - log H``, so a probability that underflows float32 still gives its true loss
    and a gradient (in probability space it would be clamped near 87 with zero gradient).
    """
    if heads not in POINTER_HEADS:
        raise InputError(f"--pointer-heads: unknown choice {heads!r}; choose one of {', '.join(POINTER_HEADS)}")
    valid = hints.ne(HINT_PAD)
    index = hints.clamp_min(0)
    total = None
    for log_attn in log_attentions:
        if log_attn.shape[0] != hints.shape[0] or log_attn.shape[2] != hints.shape[1]:
            raise InputError(
                f"syntax hints of shape {tuple(hints.shape)} do not match the decoder self-attention "
                f"of shape {tuple(log_attn.shape)} (batch, heads, target, source)"
            )
        # A key the mask removes has log 0 = -inf; a finite floor keeps logsumexp and its gradient free of
        # NaN in rows where every head has it (a left-padding row; hints are causal and never point there).
        log_attn = log_attn.float().clamp_min(torch.finfo(torch.float32).min)
        if heads == "mean":
            log_attn = torch.logsumexp(log_attn, dim=1, keepdim=True) - math.log(log_attn.size(1))
        elif heads == "first":
            log_attn = log_attn[:, :1]
        picked = log_attn.gather(-1, index[:, None, :, None].expand(-1, log_attn.size(1), -1, 1)).squeeze(-1)
        layer = (-picked.mean(dim=1)).masked_fill(~valid, 0.0).sum()  # (B, T) -> sum
        total = layer if total is None else total + layer
    return total


def pointer_attention_modules(model):
    """The decoder self-attentions the pointer loss reads (an error for a model it cannot train)."""
    try:
        modules = decoder_self_attentions(model)
    except ValueError as e:
        raise InputError(
            "the pointer loss (--criterion *_with_pointer) needs a bet-fairseq model whose decoder self-attention "
            f"can be captured (--arch bet_sg_iwslt, bet_sg_wmt_en_de, bet_sg_lm ...): {e}"
        ) from None
    diag_free = sorted({m.variant_name for m in modules if m.masks_diagonal})
    if diag_free:
        raise InputError(
            f"the pointer loss cannot train a self-attention that masks the diagonal (--self-attn-mode {diag_free[0]}): "
            "hints that point at a position itself would need log 0; use --arch bet_sg_* "
            "(vanilla self-attention) or --bet-keep-diagonal"
        )
    return modules


def add_pointer_loss(loss, logging_output, log_attentions, hints, pointer_lambda, pointer_heads):
    """``loss + lambda_p * L_p``, with ``loss``, ``pointer_loss`` and ``pointer_ntokens`` logged (both pointer
    criteria)."""
    p_loss = pointer_loss(log_attentions, hints, pointer_heads)
    loss = loss + pointer_lambda * p_loss
    logging_output["loss"] = loss.data
    logging_output["pointer_loss"] = p_loss.data
    logging_output["pointer_ntokens"] = int(hints.ne(HINT_PAD).sum())
    return loss


def check_pointer_options(pointer_lambda, pointer_heads, task=None):
    """The pointer options, and that ``task`` gives the batches hints: under a task without them (--task translation)
    the pointer loss would never be computed and the run would train a plain Transformer without a word."""
    if not math.isfinite(pointer_lambda) or pointer_lambda < 0:
        raise InputError(f"--pointer-lambda must be a finite number >= 0, got {pointer_lambda}")
    if str(pointer_heads) not in POINTER_HEADS:
        raise InputError(f"--pointer-heads: unknown choice {pointer_heads!r}; choose one of {', '.join(POINTER_HEADS)}")
    from ..models.task_fit import task_name
    from ..tasks.syntax_hints import LanguageModelingSyntaxHintsTask, TranslationSyntaxHintsTask

    if task is not None and pointer_lambda > 0 and not isinstance(
            task, (TranslationSyntaxHintsTask, LanguageModelingSyntaxHintsTask)):
        raise InputError(f"--criterion with a pointer loss needs the syntax hints of --task translation_syntax_hints "
                         f"or language_modeling_syntax_hints (files from bet-syntax-hints); --task {task_name(task)} "
                         "has none")


@register_criterion("label_smoothed_cross_entropy_with_pointer", dataclass=LabelSmoothedCrossEntropyWithPointerConfig)
class LabelSmoothedCrossEntropyWithPointerCriterion(LabelSmoothedCrossEntropyCriterion):
    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0, report_accuracy=False,
                 pointer_lambda=POINTER_DEFAULT["pointer_lambda"], pointer_heads=POINTER_DEFAULT["pointer_heads"]):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        check_pointer_options(pointer_lambda, pointer_heads, task)
        self.pointer_lambda = pointer_lambda
        self.pointer_heads = str(pointer_heads)
        self._warned = False

    def _attention_modules(self, model):
        return pointer_attention_modules(model)

    def forward(self, model, sample, reduce=True):
        hints = sample.get(SYNTAX_HINTS) if (self.pointer_lambda > 0 and reduce) else None
        if hints is None and self.pointer_lambda > 0 and model.training and not self._warned:
            self._warned = True
            logger.warning("training batch without syntax_hints: no pointer loss (train with --task "
                           "translation_syntax_hints / language_modeling_syntax_hints and bet-syntax-hints files)")
        modules = self._attention_modules(model) if hints is not None else []
        with capture_attention(modules) as captured:
            net_output = model(**sample["net_input"])
            log_attentions = [layer.log_probs for layer in captured.layers()]

        loss, nll_loss = self.compute_loss(model, net_output, sample, reduce=reduce)
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "loss": loss.data,
            "nll_loss": nll_loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        }
        if hints is not None:
            loss = add_pointer_loss(loss, logging_output, log_attentions, hints, self.pointer_lambda, self.pointer_heads)
        if self.report_accuracy:
            n_correct, total = self.compute_accuracy(model, net_output, sample)
            logging_output["n_correct"] = utils.item(n_correct.data)
            logging_output["total"] = utils.item(total.data)
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        ntokens = sum(log.get("pointer_ntokens", 0) for log in logging_outputs)
        if ntokens > 0:
            p_sum = utils.item(sum(log.get("pointer_loss", 0) for log in logging_outputs))
            metrics.log_scalar("pointer_loss", p_sum / ntokens / math.log(2), ntokens, round=3)
