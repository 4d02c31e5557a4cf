"""The defaults every bet_fairseq model applies, whichever architecture name it was reached by."""

from fairseq.models.transformer import transformer_wmt_en_de
from fairseq.models.transformer_lm import base_lm_architecture
from fairseq.utils import safe_getattr

from ..catalog import Size


def fill(args, **defaults):
    """Set each option the command line (or checkpoint) left unset."""
    for name, value in defaults.items():
        if safe_getattr(args, name, None) is None:
            setattr(args, name, value)


def translation_defaults(args):
    fill(args, self_attn_mode="vanilla")
    transformer_wmt_en_de(args)


def apply_lm_size(args, size: Size):
    fill(args, **size.dims, decoder_layers=6)


def lm_defaults(args):
    """fairseq's ``base_lm_architecture``, except that it does not force pre-norm: the paper's layers
    (its equations 2-3) and the authors' code are post-norm, and fairseq's flag
    ``--decoder-normalize-before`` keeps its meaning (pre-norm when given). Checkpoints saved while
    fairseq forced it store ``decoder_normalize_before=True`` and so stay pre-norm."""
    fill(args, self_attn_mode="vanilla")
    normalize_before = safe_getattr(args, "decoder_normalize_before", False)
    base_lm_architecture(args)
    args.decoder_normalize_before = bool(normalize_before)
