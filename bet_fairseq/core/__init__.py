"""The attention math of every variant, in plain PyTorch (no fairseq import).

Usable in any PyTorch model; the fairseq modules of ``bet_fairseq.attention`` are thin adapters over
these functions. Conventions: ``q, k, v`` are ``(batch, heads, length, head_dim)``; a query block is
the *last* ``T`` of the ``S`` key positions (so a full sequence and one incremental decoding step are
the same computation); ``allowed`` is a boolean mask broadcastable to ``(batch, heads, T, S)`` or
``None`` (every key visible); logits and softmax are computed in float32 whatever the input dtype.

BET's equations: ``functional.py`` (with ``masks.py``'s DiagFreeMask); the first author's code form:
``author_form.py``; the same numbers computed faster: ``kernels.py`` (fused, for training) and
``decoding_step.py`` (one token); which of them runs: ``paths.py``; the baselines: ``baselines.py``.
"""

from .masks import (  # noqa: F401
    causal_allowed,
    diagonal_free,
    masked_log_softmax,
    masked_softmax,
    own_position,
    safe_sdpa,
)
from .functional import bet_key_scores, bet_sf_attention, bet_sf_logits, scale_diagonal  # noqa: F401
from .author_form import bet_authors_attention, bet_authors_key_scores, bet_authors_logits  # noqa: F401
from .baselines import (  # noqa: F401
    hopfield_logits,
    localness_bias,
    relative_logits,
    relative_sinusoids,
    top_k_keep,
)
from .paths import BetPath, bet_sf_fused, choose_path  # noqa: F401
from .incremental import bet_sf_with_state  # noqa: F401
from .modules import BirdEyeCache, BirdEyeSelfAttention  # noqa: F401
