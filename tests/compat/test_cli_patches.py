"""Two of bet_fairseq.compat's fairseq patches on their own: ``fairseq-train --help`` lists the plugin's
options, and fairseq-fixed's batching keeps the last batch (the end-to-end consequence, every test
sentence translated, is checked in tests/models/test_cli_end_to_end.py). The distributed patch has
tests/compat/test_distributed.py; safe checkpoint loading is used by every test that reads a checkpoint."""

import dataclasses

import numpy as np

from cli_utils import USER_DIR, cli

from bet_fairseq import compat
from bet_fairseq.attention import option_classes, option_fields


def test_help_lists_every_plugin_option(tmp_path):
    """fairseq prints --help during its first parse, before any model adds its options: the patch adds the
    plugin's groups then, so each variant's flags (and the Transformer-XL, syntax-hint and pointer-loss
    options) show up."""
    out = cli("fairseq-train", tmp_path, "--user-dir", USER_DIR, "--arch", "bet_sf_iwslt", "--help").stdout
    flags = ["--self-attn-mode", "--mem-len", "--pointer-lambda", "--pointer-heads", "--syntax-hints-optional"]
    flags += ["--" + f.name.replace("_", "-") for options in option_classes() for f in option_fields(options)]
    assert len(flags) > 14 and "--bet-share-w" in flags and "--routing-ema-decay" in flags
    assert [flag for flag in flags if flag not in out] == []
    titles = [title for title, _ in compat._HELP_GROUPS]
    assert [title for title in titles if title not in out] == []
    classes = [dc.__name__ for _, dc in compat._HELP_GROUPS]
    assert "AttentionConfig" in classes and "TransformerXLConfig" in classes
    assert all(dataclasses.is_dataclass(dc) for _, dc in compat._HELP_GROUPS)


def test_the_last_batch_is_kept():
    """fairseq-fixed's batch_by_size drops a last batch that is not a multiple of
    --required-batch-size-multiple (37 sentences, batches of 16 in multiples of 8: 32 come back); the
    patched one returns every index, in order."""
    from fairseq.data import data_utils

    indices = np.arange(37, dtype=np.int64)
    sizes = dict(num_tokens_vec=np.full(37, 10, dtype=np.int64), max_sentences=16, required_batch_size_multiple=8)
    original = data_utils.batch_by_size.__wrapped__(indices, lambda i: 10, **sizes)
    assert sum(len(b) for b in original) < 37, "fairseq keeps the last batch now: the patch can go"
    batches = data_utils.batch_by_size(indices, lambda i: 10, **sizes)
    assert np.concatenate(batches).tolist() == list(range(37))
    compat.keep_last_batch()  # idempotent: no second wrapper
    assert not hasattr(data_utils.batch_by_size.__wrapped__, "_bet_keeps_last_batch")
