"""Ramsauer et al. 2020, "Hopfield Networks is All You Need": the Hopfield layer as causal self-attention.

Two configurations (``--hopfield-config``), R = Y = the layer input in both:

``library`` (the default; the Table 2 row): the ``Hopfield`` layer of the authors' library
(ml-jku/hopfield-layers, ``hflayers``) with its defaults, as the BET authors' code builds it
(``Hopfield(input_size=E)``): an affine LayerNorm on each of the state pattern, stored pattern and
pattern projection inputs, ``xi = LN_R(R) W_Q``, ``K = LN_Y(Y) W_K``, ``V = LN_P(Y) W_V`` (all with
biases), the model's heads of size E / heads (the library's default of one head of size E:
``--hopfield-heads 1``), ``beta = 1/sqrt(head size)``, update steps ``xi <- softmax(beta xi K^T) K`` until
the association row changes by at most ``update_steps_eps`` or ``update_steps_max`` updates were made (0,
the library's default, makes none: a single association), then ``out_proj(softmax(beta xi K^T) V)``, the
attention dropout on the last association (the library's ``dropout``); weights drawn as the library draws
them (normal, std 0.02; biases 0).

``attention`` (version 0.1's): no LayerNorms, the model's heads, ``V = (Y W_K) W_V`` (the value projection
applied to the keys) and a fixed number of steps; with steps=1 and beta = 1/sqrt(d_head) it is standard
attention with ``W_V' = W_K W_V``.

Every association is causal and the stopping decision is per query row, so a decoding step computes
what the full pass computes; K and V are per key (the base class caches them).
"""

import math
from dataclasses import dataclass, field
from typing import Optional

from torch import nn

from fairseq.dataclass import FairseqDataclass

from ..option_history import option_added
from ..core.baselines import hopfield_logits
from ..core.masks import safe_sdpa
from . import Attended, SelfAttentionVariant, register_variant
from ..errors import InputError

CONFIGS = ("library", "attention")
LIBRARY_INIT_STD = 0.02  # hflayers HopfieldCore.reset_parameters
LIBRARY_LAYER_NORM_EPS = 1e-5


@dataclass
class HopfieldOptions(FairseqDataclass):
    hopfield_config: str = field(
        default="library",
        metadata={"help": "hopfield: 'library' (ml-jku/hopfield-layers' Hopfield layer with its defaults: "
                          "LayerNorms on the inputs, V = Y W_V, update steps until --hopfield-update-steps-eps) "
                          "or 'attention' (version 0.1's: V = Y W_K W_V, --hopfield-steps fixed steps)",
                  # checkpoints saved before the option were trained with the attention configuration
                  **option_added("0.2", before="attention")},
    )
    hopfield_beta: Optional[float] = field(
        default=None, metadata={"help": "hopfield: inverse temperature beta > 0 (default 1/sqrt(head dim))"}
    )
    hopfield_steps: Optional[int] = field(
        default=None,
        metadata={"help": "hopfield: associations >= 1 (default 1; more iterate xi <- softmax(beta xi K^T) K); "
                          "with the library config at most that many (--hopfield-update-steps-max N - 1)"},
    )
    hopfield_heads: Optional[int] = field(
        default=None,
        metadata={"help": "hopfield, library config: association heads, dividing the model dimension "
                          "(default: the model's; head size = model dim / heads, as the library sizes it; "
                          "1 is the library's own default)"},
    )
    hopfield_update_steps_max: Optional[int] = field(
        default=None,
        metadata={"help": "hopfield, library config: most update steps after the first association "
                          "(default 0, the library's: none; -1: no maximum)"},
    )
    hopfield_update_steps_eps: Optional[float] = field(
        default=None,
        metadata={"help": "hopfield, library config: a query stops updating once its association changed "
                          "by at most this (L2) in an update (default 1e-4, the library's)"},
    )


def _whole(value, flag, minimum):
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
        raise InputError(f"{flag} must be a whole number >= {minimum}, got {value!r}")


def _positive(value, flag, what):
    if value is None:
        return
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{flag} must be a number, got {value!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"{flag} must be a finite number > 0 ({what}), got {value}")


@register_variant("hopfield", options=HopfieldOptions)
class HopfieldSelfAttention(SelfAttentionVariant):
    @classmethod
    def check_options(cls, options, num_heads):
        config = options.hopfield_config
        if config not in CONFIGS:
            raise InputError(f"--hopfield-config must be one of {', '.join(CONFIGS)}, got {config!r}")
        _whole(options.hopfield_steps, "--hopfield-steps", 1)
        _positive(options.hopfield_beta, "--hopfield-beta", "the inverse temperature")
        _whole(options.hopfield_heads, "--hopfield-heads", 1)
        _whole(options.hopfield_update_steps_max, "--hopfield-update-steps-max", -1)
        _positive(options.hopfield_update_steps_eps, "--hopfield-update-steps-eps", "the stopping tolerance")
        most = options.hopfield_update_steps_max
        if options.hopfield_steps is not None and most is not None and options.hopfield_steps != most + 1:
            raise InputError(f"--hopfield-steps {options.hopfield_steps} (associations) and "
                             f"--hopfield-update-steps-max {most} (updates after the first) disagree; give one")
        if config == "attention":
            for flag, value in (("--hopfield-heads", options.hopfield_heads),
                                ("--hopfield-update-steps-max", most),
                                ("--hopfield-update-steps-eps", options.hopfield_update_steps_eps)):
                if value is not None:
                    raise InputError(f"{flag} applies to --hopfield-config library (the config is 'attention')")

    def __init__(self, embed_dim, num_heads, options=None, **kwargs):
        options = self.options_class() if options is None else options
        self.library = options.hopfield_config == "library"
        if self.library and options.hopfield_heads is not None:
            if embed_dim % options.hopfield_heads:
                raise InputError(f"--hopfield-heads {options.hopfield_heads} must divide the model dimension "
                                 f"{embed_dim}")
            num_heads = options.hopfield_heads
        super().__init__(embed_dim, num_heads, options=options, **kwargs)
        beta = self.options.hopfield_beta
        self.hopfield_beta = 1.0 / math.sqrt(self.head_dim) if beta is None else float(beta)
        if self.library:
            most, steps = self.options.hopfield_update_steps_max, self.options.hopfield_steps
            most = (0 if steps is None else steps - 1) if most is None else most
            self.hopfield_steps = None if most < 0 else most + 1  # associations, at most
            eps = self.options.hopfield_update_steps_eps
            self.hopfield_eps = 1e-4 if eps is None else float(eps)
            self.norm_state_pattern = nn.LayerNorm(embed_dim, eps=LIBRARY_LAYER_NORM_EPS)
            self.norm_stored_pattern = nn.LayerNorm(embed_dim, eps=LIBRARY_LAYER_NORM_EPS)
            self.norm_pattern_projection = nn.LayerNorm(embed_dim, eps=LIBRARY_LAYER_NORM_EPS)
        else:
            self.hopfield_steps = self.options.hopfield_steps or 1
            self.hopfield_eps = None

    def reset_parameters(self):
        """The library's initialisation in the library config (``MultiheadAttention.__init__`` calls it)."""
        if not getattr(self, "library", False):
            return super().reset_parameters()
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.normal_(proj.weight, mean=0.0, std=LIBRARY_INIT_STD)
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)

    def project(self, query, context):
        if self.library:
            q = self.q_proj(self.norm_state_pattern(query))
            k = self.k_proj(self.norm_stored_pattern(context))
            v = self.v_proj(self.norm_pattern_projection(context))
            return self.split_heads(q), self.split_heads(k), self.split_heads(v)
        keys = self.k_proj(context)
        q = self.split_heads(self.q_proj(query))  # unscaled: beta is the temperature
        return q, self.split_heads(keys), self.split_heads(self.v_proj(keys))  # pattern projection Y W_K W_V

    def scores(self, q, k, allowed):
        return hopfield_logits(q, k, self.hopfield_beta, self.hopfield_steps, allowed, self.hopfield_eps)

    def attend(self, q, k, v, allowed, cache, exact):
        if self.hopfield_steps == 1 and not exact and self.use_fused_attention:  # one association: attention
            return Attended(safe_sdpa(q * self.hopfield_beta, k, v, allowed, self.dropout_p()))
        return self.attend_to_logits(self.scores(q, k, allowed), allowed, v)
