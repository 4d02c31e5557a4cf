"""``choose_path``, the one place that decides how BET(SF) is computed, rule by rule on CPU (the GPU rule,
``CAUSAL_SDPA``, needs a GPU), and ``bet_sf_fused`` on each path it runs against the equations."""

import pytest
import torch

from bet_fairseq.core import BetPath, bet_sf_fused, causal_allowed, choose_path
from conftest import padding_mask
from test_bet_sf_causal_kernel import B, D, H, dense_bet_sf


def qk(tgt, src=None, dtype=torch.float32):
    torch.manual_seed(tgt)
    return torch.randn(B, H, tgt, D, dtype=dtype), torch.randn(B, H, src or tgt, D, dtype=dtype)


def test_each_rule_on_cpu():
    q, k = qk(100)
    causal = causal_allowed(100, 100)
    left_padded = causal & ~padding_mask(B, 100, left=[(0, 3)]).view(B, 1, 1, 100)  # 3 rows without keys
    right_padded = causal & ~padding_mask(B, 100, right=[(1, 3)]).view(B, 1, 1, 100)
    assert choose_path(q, k, causal) is BetPath.CPU_KERNEL
    assert choose_path(q, k, right_padded) is BetPath.CPU_KERNEL
    assert choose_path(q, k, causal, fused=False) is BetPath.EXACT  # weights, a cache or the fused path off
    assert choose_path(q, k, causal, cpu_exact_max_keys=100) is BetPath.EXACT  # short on CPU
    assert choose_path(q, k, causal, cpu_exact_max_keys=99) is BetPath.CPU_KERNEL
    assert choose_path(q, k, causal, form="authors") is BetPath.FOLDED_SDPA
    assert choose_path(q, k, causal, dropout_p=0.1) is BetPath.FOLDED_SDPA
    assert choose_path(*qk(100, dtype=torch.bfloat16), causal) is BetPath.FOLDED_SDPA
    assert choose_path(q, k, left_padded) is BetPath.FOLDED_SDPA
    assert choose_path(q, k, None) is BetPath.FOLDED_SDPA
    q_step, k_all = qk(1, 100)  # queries after cached keys: T != S
    assert choose_path(q_step, k_all, causal_allowed(1, 100)) is BetPath.FOLDED_SDPA


@pytest.mark.parametrize("path", [BetPath.CPU_KERNEL, BetPath.CAUSAL_SDPA, BetPath.FOLDED_SDPA])
def test_every_fused_path_gives_the_equations(path):
    q, k = qk(70)
    v, w = torch.randn_like(k), torch.randn(H, 2 * D)
    allowed = causal_allowed(70, 70)
    want = dense_bet_sf(q, k, v, w, allowed, keep_diagonal=False)
    torch.testing.assert_close(bet_sf_fused(q, k, v, w, allowed, path=path).double(), want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="bet_sf_attention"):
        bet_sf_fused(q, k, v, w, allowed, path=BetPath.EXACT)
