"""BET(SF): syntax-free re-weighting of the keys plus the DiagFreeMask (Sha et al., section 3).

``--bet-form equations`` (the default), the paper's equations: a first pass ``A = softmax(D)``, ``H = A V``; per
key ``R_j = sigmoid(w . [H_j ; K_j])``; a second pass ``A' = softmax(DiagFreeMask(D * R))``, output ``A' V``.
``w`` (2 * head_dim per head, or one row shared by the heads) is the only added parameter. R of a key depends
only on positions up to it, so an incremental decoder caches R and ``V w_h`` per key (batch-first) and never
recomputes them.

``--bet-form authors`` / ``authors_lm``, the first author's public code (README, "The authors' BET(SF)"): one
``Linear(2 * head_dim, 1)`` with a bias (``bet_authors_w``) shared by the heads, fed with ``[K_j ; H_j]``
(authors) or ``[Q_j / sqrt(d) ; H_j]`` (authors_lm), where H is the first pass's output after ``out_proj``,
split back into heads; the second pass goes through its own output projection ``bet_out_proj2``. The decoder
caches R per key.
"""

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from ..core.functional import bet_authors_fused, bet_authors_logits, bet_sf_fused, bet_sf_logits
from ..core.masks import rows_without_keys
from . import Attended, SelfAttentionVariant, register_variant
from ..errors import InputError

BET_FORMS = ("equations", "authors", "authors_lm")


@dataclass
class BetOptions(FairseqDataclass):
    bet_keep_diagonal: bool = field(
        default=False,
        metadata={"help": "bet_sf: keep the diagonal (no DiagFreeMask; the 'BET(SF) - DiagFreeMask' row)"},
    )
    bet_share_w: bool = field(
        default=False, metadata={"help": "bet_sf: one w shared by all heads instead of one w per head"}
    )
    bet_form: ChoiceEnum(list(BET_FORMS)) = field(
        default="equations",
        metadata={"help": "bet_sf: equations (the paper's equations: w per head on [H ; K], no bias); authors (the "
                          "first author's fairseq code: one Linear(2*head_dim, 1) with a bias for all heads on "
                          "[K ; H], H after the output projection, a second output projection); authors_lm (the "
                          "same on [Q ; H], the authors' language-model code)"},
    )


@register_variant("bet_sf", options=BetOptions)
class BetSFSelfAttention(SelfAttentionVariant):
    # On CPU, up to this many keys the exact path (autograd over the materialised matrices) is a little
    # faster than the fused kernel; from 128 keys on the kernel is as fast and keeps no T x S matrix
    # (docs/performance.md). Set to 0 to always take the fused path when use_fused_attention is on.
    cpu_exact_max_keys = 64

    def __init__(self, embed_dim, num_heads, options=None, **kwargs):
        super().__init__(embed_dim, num_heads, options=options, **kwargs)
        self.bet_form = str(self.options.bet_form)
        if self.bet_form == "equations":
            # [H_j ; K_j] of one head -> one logit; per head unless shared.
            self.bet_w = nn.Parameter(torch.empty(1 if self.options.bet_share_w else num_heads, 2 * self.head_dim))
            bound = 1.0 / math.sqrt(2 * self.head_dim)
            nn.init.uniform_(self.bet_w, -bound, bound)
        else:
            # The authors' `f` and `out_proj2`, with nn.Linear's own initialisation as there.
            self.bet_authors_w = nn.Linear(2 * self.head_dim, 1, bias=True)
            self.bet_out_proj2 = nn.Linear(embed_dim, embed_dim, bias=self.out_proj.bias is not None)

    @classmethod
    def check_options(cls, options, num_heads: int):
        form = str(options.bet_form)
        if form not in BET_FORMS:
            raise InputError(f"--bet-form: unknown form {form!r}; choose one of {', '.join(BET_FORMS)}")
        if form != "equations" and options.bet_share_w:
            raise InputError(f"--bet-share-w only applies to --bet-form equations (--bet-form {form} always "
                             "shares one w by all heads)")

    @property
    def masks_diagonal(self) -> bool:
        return not self.options.bet_keep_diagonal

    def take_fused(self, k, exact) -> bool:
        return (not exact and self.use_fused_attention
                and not (k.device.type == "cpu" and k.size(2) <= self.cpu_exact_max_keys))

    def attend(self, q, k, v, allowed, cache, exact):
        if self.bet_form != "equations":
            return self.attend_authors(q, k, v, allowed, cache, exact)
        keep = bool(self.options.bet_keep_diagonal)
        if self.take_fused(k, exact):
            return Attended(bet_sf_fused(q, k, v, self.bet_w, allowed, keep, self.dropout_p()))
        empty = rows_without_keys(allowed)  # once: both passes have the same rows without keys
        logits, final_allowed, first, r, vw = bet_sf_logits(
            q, k, v, self.bet_w, allowed, keep, cache.get("bet_r"), cache.get("bet_vw"), empty)
        return self.attend_to_logits(logits, final_allowed, v, {"bet_r": r, "bet_vw": vw}, first, empty)

    def attend_authors(self, q, k, v, allowed, cache, exact):
        """The authors' forms: ``out_proj`` makes the first pass's H (for R); the second pass's output
        goes through ``bet_out_proj2`` (``output_projection``). Attention dropout on both passes, as there."""
        keep = bool(self.options.bet_keep_diagonal)
        r_input = "query" if self.bet_form == "authors_lm" else "key"
        w = self.bet_authors_w
        if self.take_fused(k, exact):
            return Attended(bet_authors_fused(q, k, v, w.weight, w.bias, self.out_proj, allowed, keep, r_input,
                                              self.dropout_p()))
        logits, final_allowed, first, r = bet_authors_logits(
            q, k, v, w.weight, w.bias, self.out_proj, allowed, keep, r_input, self.dropout_module, cache.get("bet_r"))
        return self.attend_to_logits(logits, final_allowed, v, {"bet_r": r}, first)

    def output_projection(self, out):
        return self.out_proj(out) if self.bet_form == "equations" else self.bet_out_proj2(out)

    def upgrade_state_dict_named(self, state_dict, name):
        prefix = name + "." if name else ""
        theirs = "equations" if prefix + "bet_w" in state_dict else (
            "authors or authors_lm" if prefix + "bet_authors_w.weight" in state_dict else None)
        if theirs is not None and (theirs == "equations") != (self.bet_form == "equations"):
            raise InputError(f"checkpoint's {name or 'attention'} is a --bet-form {theirs} BET(SF), this model is "
                             f"--bet-form {self.bet_form}: build it with the --bet-form it was trained with")
        key = prefix + "bet_w"
        if key in state_dict and tuple(state_dict[key].shape) != tuple(self.bet_w.shape):
            raise InputError(
                f"checkpoint's {key} has shape {tuple(state_dict[key].shape)}, this model expects "
                f"{tuple(self.bet_w.shape)} (--bet-share-w differs between checkpoint and model)"
            )
        super().upgrade_state_dict_named(state_dict, name)
