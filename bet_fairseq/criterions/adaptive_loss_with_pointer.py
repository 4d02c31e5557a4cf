"""BET(SG)'s pointer loss beside fairseq's adaptive softmax (``--adaptive-softmax-cutoff``).

A language model with a 33k-word vocabulary spends most of an update in its output layer; fairseq's
``adaptive_loss`` (Grave et al. 2017) trains it a few times faster. This is that criterion plus the same
pointer loss as ``label_smoothed_cross_entropy_with_pointer`` (``pointer_loss``, its options and defaults):

    loss = adaptive_nll + pointer_lambda * sum_blocks sum_{non-pad t} -log A_block[t, hint_t]

Logged: ``loss`` (with ``lambda_p * L_p``), ``nll_loss`` and ``ppl`` (the token loss alone, what
``--best-checkpoint-metric nll_loss`` selects on) and ``pointer_loss`` (per target position, base 2,
before lambda_p). A batch without hints, or ``--pointer-lambda 0``, gives fairseq's ``adaptive_loss``.
"""

import math
from dataclasses import dataclass

from fairseq import utils
from fairseq.criterions import register_criterion
from fairseq.criterions.adaptive_loss import AdaptiveLoss, AdaptiveLossConfig
from fairseq.logging import metrics

from ..attention.capture import capture_attention
from ..syntax_hint_batch import SYNTAX_HINTS
from .label_smoothed_cross_entropy_with_pointer import (
    PointerLossOptions,
    add_pointer_loss,
    check_pointer_options,
    pointer_attention_modules,
)


@dataclass
class AdaptiveLossWithPointerConfig(AdaptiveLossConfig, PointerLossOptions):
    pass


@register_criterion("adaptive_loss_with_pointer", dataclass=AdaptiveLossWithPointerConfig)
class AdaptiveLossWithPointer(AdaptiveLoss):
    def __init__(self, task, sentence_avg, pointer_lambda, pointer_heads):
        super().__init__(task, sentence_avg)
        check_pointer_options(pointer_lambda, pointer_heads, task)
        self.pointer_lambda = pointer_lambda
        self.pointer_heads = str(pointer_heads)

    @classmethod
    def build_criterion(cls, cfg: AdaptiveLossWithPointerConfig, task):
        base = AdaptiveLoss.build_criterion(cfg, task)  # fairseq's checks (the DDP backend)
        return cls(task, base.sentence_avg, cfg.pointer_lambda, cfg.pointer_heads)

    def forward(self, model, sample, reduce=True):
        hints = sample.get(SYNTAX_HINTS) if (self.pointer_lambda > 0 and reduce) else None
        modules = pointer_attention_modules(model) if hints is not None else []
        with capture_attention(modules) as captured:
            loss, sample_size, logging_output = super().forward(model, sample, reduce)
            log_attentions = [layer.log_probs for layer in captured.layers()]
        logging_output["nll_loss"] = loss.data
        if hints is not None:
            loss = add_pointer_loss(loss, logging_output, log_attentions, hints, self.pointer_lambda, self.pointer_heads)
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        def total(key):
            return utils.item(sum(log.get(key, 0) for log in logging_outputs))

        sample_size, ntokens = total("sample_size"), total("ntokens")
        metrics.log_scalar("loss", total("loss") / sample_size / math.log(2), sample_size, round=3)
        metrics.log_scalar("nll_loss", total("nll_loss") / ntokens / math.log(2), ntokens, round=3)
        metrics.log_derived("ppl", lambda meters: utils.get_perplexity(meters["nll_loss"].avg))
        pointer_ntokens = total("pointer_ntokens")
        if pointer_ntokens > 0:
            metrics.log_scalar("pointer_loss", total("pointer_loss") / pointer_ntokens / math.log(2), pointer_ntokens,
                               round=3)
