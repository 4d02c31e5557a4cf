"""BET(SF): syntax-free re-weighting of the keys plus the DiagFreeMask (Sha et al., section 3; docs/method.md,
"BET(SF) re-weighting" and "diagonal-free mask").

``--bet-form equations`` (the default), the paper's equations: a first pass ``A = softmax(D)``, ``H = A V``; per
key ``R_j = sigmoid(w . [H_j ; K_j])``; a second pass ``A' = softmax(DiagFreeMask(D * R))``, output ``A' V``.
``w`` (2 * head_dim per head, or one row shared by the heads) is the only added parameter. R of a key depends
only on positions up to it, so an incremental decoder caches R and ``V w_h`` per key (batch-first) and never
recomputes them.

``--bet-form authors`` / ``authors_lm``, the first author's public code (docs/method.md, §3.4): one
``Linear(2 * head_dim, 1)`` with a bias (``bet_authors_w``) shared by the heads, fed with ``[K_j ; H_j]``
(authors) or ``[Q_j / sqrt(d) ; H_j]`` (authors_lm), where H is the first pass's output after ``out_proj``,
split back into heads; the second pass goes through its own output projection ``bet_out_proj2``. The decoder
caches R per key.

Which computation runs is ``core.paths.choose_path``'s decision. A decoding step that sees every key (beam search,
sampling: one token, no padding) takes ``decoding_step`` (``core/decoding_step.py``): two matrix products make q
and, per head, k, v and what R needs of the new key (weights derived once per generation), no mask tensor, the cache
read as it is stored: vanilla's 10 operators plus 4 (docs/method.md, §3.5; ``run/bench_decoding_step.py`` counts
them).
"""

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from ..core.author_form import bet_authors_logits
from ..core.decoding_step import bet_authors_step, bet_authors_step_projection, bet_sf_step, bet_sf_step_projection
from ..core.functional import bet_sf_logits
from ..core.kernels import bet_authors_fused
from ..core.masks import rows_without_keys
from ..core.paths import CPU_EXACT_MAX_KEYS, BetPath, bet_sf_fused, choose_path
from . import Attended, SelfAttentionVariant, register_variant
from ..errors import InputError
from .base import CACHE_PREFIX

BET_FORMS = ("equations", "authors", "authors_lm")
STEP_WEIGHTS = "bet_step_weights"  # the incremental state's entry of decoding_step's derived weights


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
    # On CPU, up to this many keys the exact path (see ``choose_path``); 0: the fused path whenever
    # ``use_fused_attention`` is on.
    cpu_exact_max_keys = CPU_EXACT_MAX_KEYS

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

    def path(self, q, k, allowed, exact) -> BetPath:
        return choose_path(q, k, allowed, bool(self.options.bet_keep_diagonal), self.dropout_p(),
                           fused=not exact and self.use_fused_attention, form=self.bet_form,
                           cpu_exact_max_keys=self.cpu_exact_max_keys)

    def attend(self, q, k, v, allowed, cache, exact):
        if self.bet_form != "equations":
            return self.attend_authors(q, k, v, allowed, cache, exact)
        keep = bool(self.options.bet_keep_diagonal)
        path = self.path(q, k, allowed, exact)
        if path is not BetPath.EXACT:
            return Attended(bet_sf_fused(q, k, v, self.bet_w, allowed, keep, self.dropout_p(), path=path))
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
        if self.path(q, k, allowed, exact) is not BetPath.EXACT:
            return Attended(bet_authors_fused(q, k, v, w.weight, w.bias, self.out_proj, allowed, keep, r_input,
                                              self.dropout_p()))
        logits, final_allowed, first, r = bet_authors_logits(
            q, k, v, w.weight, w.bias, self.out_proj, allowed, keep, r_input, self.dropout_module, cache.get("bet_r"))
        return self.attend_to_logits(logits, final_allowed, v, {"bet_r": r}, first)

    # ------------------------------------------------------------------------------- one decoding step
    def forward(self, query, key, value, key_padding_mask=None, incremental_state=None, need_weights=True,
                static_kv=False, attn_mask=None, before_softmax=False, need_head_weights=False):
        saved = None
        if (incremental_state is not None and query.size(0) == 1 and (key is None or key is query)
                and key_padding_mask is None and attn_mask is None and not (need_weights or need_head_weights)
                and not (static_kv or before_softmax or self.capture_attention) and self.dropout_p() == 0.0):
            saved = self._get_input_buffer(incremental_state)
        if saved is None or not self.step_cache_complete(saved):
            return super().forward(query, key, value, key_padding_mask, incremental_state, need_weights, static_kv,
                                   attn_mask, before_softmax, need_head_weights)
        return self.decoding_step(query, saved, incremental_state), None

    def step_cache_complete(self, saved) -> bool:
        """The cache holds the earlier keys with their R (and V w_h) and no padding mask."""
        prev_key = saved.get("prev_key")
        if prev_key is None or saved.get("prev_key_padding_mask") is not None:
            return False
        names = ("bet_r", "bet_vw") if self.bet_form == "equations" else ("bet_r",)
        cached = [saved.get(CACHE_PREFIX + name) for name in names]
        return all(t is not None and t.size(2) == prev_key.size(2) for t in cached)

    def decoding_step(self, x, saved, incremental_state):
        """One token (1, B, E) that sees every cached key, as ``forward`` computes it (within float rounding):
        q and ``k | v | R's terms`` from two products, the rest in ``bet_sf_step`` / ``bet_authors_step``."""
        bsz, embed_dim, d = x.size(1), x.size(2), self.head_dim
        q_weight, q_bias, kv_weight, kv_bias, *g = self.step_weights(incremental_state)
        q = F.linear(x, q_weight, q_bias).view(bsz, self.num_heads, 1, d)
        kv = F.linear(x, kv_weight, kv_bias).view(bsz, self.num_heads, 1, -1)  # per head: k | v | R's terms
        k = torch.cat([saved["prev_key"], kv[..., :d]], dim=2)
        v = torch.cat([saved["prev_value"], kv[..., d:2 * d]], dim=2)
        keep, prev_r = bool(self.options.bet_keep_diagonal), saved[CACHE_PREFIX + "bet_r"]
        if self.bet_form == "equations":
            out, r, vw = bet_sf_step(q, k, v, kv[..., 2 * d], kv[..., 2 * d + 1], prev_r,
                                     saved[CACHE_PREFIX + "bet_vw"], keep)
            saved[CACHE_PREFIX + "bet_vw"] = vw
        else:
            out, r = bet_authors_step(q, k, v, kv[:, :, 0, 2 * d], g[0], prev_r, keep)
        saved["prev_key"], saved["prev_value"], saved[CACHE_PREFIX + "bet_r"] = k, v, r
        self._set_input_buffer(incremental_state, saved)
        return self.output_projection(out.view(1, bsz, embed_dim))

    def step_weights(self, incremental_state):
        """``decoding_step``'s weights, derived from the module's once per generation and kept in its incremental
        state (beside the cache, which beam search reorders: these are not per hypothesis); derived at every step
        while gradients are recorded, so that no graph is reused."""
        if torch.is_grad_enabled():
            return self.derive_step_weights()
        kept = self.get_incremental_state(incremental_state, STEP_WEIGHTS)
        if kept is None:
            kept = dict(enumerate(self.derive_step_weights()))
            self.set_incremental_state(incremental_state, STEP_WEIGHTS, kept)
        return kept.values()

    def derive_step_weights(self):
        """``(q weight, q bias, kv weight, kv bias[, g])`` of ``decoding_step`` (core: ``*_step_projection``)."""
        projections = [(p.weight, p.bias) for p in (self.q_proj, self.k_proj, self.v_proj)]
        if self.bet_form == "equations":
            return bet_sf_step_projection(*projections, self.bet_w, self.scaling, self.num_heads)
        w = self.bet_authors_w
        return bet_authors_step_projection(*projections, (self.out_proj.weight, self.out_proj.bias), w.weight, w.bias,
                                           self.scaling, self.num_heads,
                                           "query" if self.bet_form == "authors_lm" else "key")

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
