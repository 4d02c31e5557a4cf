"""Third-party noise is filtered by message and module (``bet_fairseq.quiet``), and nothing else: a
warning that is not on the list still shows. fairseq-eval-lm under the plugin prints no UserWarning,
FutureWarning or RuntimeWarning: hydra's deprecation warnings, pin_memory's and the scalar-subtract overflow are
noise a user can do nothing about (docs/quiet_commands.md says why each is safe to hide)."""

import os
import subprocess
import warnings

import numpy as np
import pytest
import torch

from cli_utils import BIN, LM_TRAIN, ROOT, USER_DIR, binarise_wikitext2, session_corpus, train_in_process

from bet_fairseq.quiet import quiet_third_party


def warns(message, category, module):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_third_party()
        warnings.warn_explicit(message, category, "x.py", 1, module=module)
    return [str(w.message) for w in seen]


def test_listed_noise_is_dropped_and_other_warnings_stay():
    assert warns("hydra.experimental.initialize() is no longer experimental. Use hydra.initialize()", UserWarning,
                 "hydra.experimental.initialize") == []
    assert warns("overflow encountered in scalar subtract", RuntimeWarning, "fairseq.data.token_block_dataset") == []
    # the same message from another module, another category, another message: all still shown
    assert warns("overflow encountered in scalar subtract", RuntimeWarning, "mymodel") != []
    assert warns("hydra.experimental.initialize() is no longer experimental", DeprecationWarning, "hydra.x") != []
    assert warns("loss is NaN", UserWarning, "fairseq.trainer") != []


class Lines(torch.utils.data.Dataset):
    def __init__(self, lines):
        self.lines, self.sizes = lines, np.array([len(x) for x in lines])

    def __getitem__(self, i):
        return self.lines[i]

    def __len__(self):
        return len(self.lines)


def test_the_token_block_overflow_only_reaches_past_target():
    """fairseq's TokenBlockDataset computes ``buffer[0 : e - 2]`` in unsigned integers: for a one-token block
    (an empty line under --sample-break-mode eos) e - 2 wraps around. Only ``past_target`` (used by
    --past-target, which no task here sets) gets that slice; source and target are right."""
    from fairseq.data import TokenBlockDataset

    lines = Lines([torch.tensor([4, 5, 6, 2]), torch.tensor([2]), torch.tensor([7, 2])])
    blocks = TokenBlockDataset(lines, lines.sizes, None, pad=1, eos=2, break_mode="eos", include_targets=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        source, target, past = blocks[1]
    assert any("overflow encountered in scalar subtract" in str(w.message) for w in seen)
    assert target.tolist() == [2] and source.tolist() == [2]  # what language modelling uses
    assert len(past) != len(target)  # the wrapped slice: wrong, and unused
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_third_party()
        blocks[1]
    assert seen == []


@pytest.fixture(scope="module")
def lm_checkpoint(tmp_path_factory):
    data = session_corpus(tmp_path_factory, binarise_wikitext2)
    return data, train_in_process(data, tmp_path_factory.mktemp("lm"), "--arch", "bet_sf_lm", *LM_TRAIN, updates=1)


def test_fairseq_eval_lm_under_the_plugin_prints_no_third_party_warnings(lm_checkpoint):
    data, checkpoint = lm_checkpoint
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}  # Python's default filters
    proc = subprocess.run([os.path.join(BIN, "fairseq-eval-lm"), data, "--user-dir", USER_DIR, "--path", checkpoint,
                           "--cpu", "--tokens-per-sample", "64", "--context-window", "32", "--batch-size", "4"],
                          capture_output=True, text=True, env=dict(env, OMP_NUM_THREADS="1"), cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert "Perplexity" in output
    noise = [line for line in output.splitlines() if "Warning" in line or "Setting JobRuntime" in line]
    assert noise == []
