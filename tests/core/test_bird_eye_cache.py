"""``BirdEyeSelfAttention`` with its own decoding cache (``BirdEyeCache``): a nanoGPT-style model samples without
recomputing the prefix, each step equal to the full forward and to tests/reference.py's float64 BET(SF)."""

import pytest
import torch

from bet_fairseq.core import BirdEyeCache
from conftest import padding_mask
from test_core import B, E, H, T, block_reference, make_block


def reference_out(block, x, padding=None):
    return block_reference(block, x, padding)[0]


def decode(block, x, cache, chunks, padding=None):
    """``x`` fed through ``cache`` in the given chunk lengths (a prompt, then single steps)."""
    outs, start = [], 0
    for length in chunks:
        pad = None if padding is None else padding[:, start:start + length]
        outs.append(block(x[:, start:start + length], pad, cache=cache))
        start += length
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("kwargs", [{}, dict(keep_diagonal=True), dict(share_w=True)],
                         ids=["bet_sf", "keepdiag", "sharew"])
def test_cached_steps_equal_the_reference_and_the_full_forward(kwargs):
    block = make_block(**kwargs)
    x = torch.randn(B, T, E)
    expected = reference_out(block, x)
    for chunks in ([1] * T, [3] + [1] * (T - 3), [3, 4]):
        cache = BirdEyeCache()
        with torch.no_grad():
            steps = decode(block, x, cache, chunks)
        torch.testing.assert_close(steps.double(), expected, atol=1e-5, rtol=1e-5)
        assert len(cache) == T
        entry = cache.get(block)
        assert entry["k"].shape == (B, H, T, E // H) and entry["r"].shape == entry["vw"].shape == (B, H, T)
    torch.testing.assert_close(block(x).double(), expected, atol=1e-5, rtol=1e-5)  # the signature without a cache


def test_cached_r_is_used_and_padding_of_past_keys_is_kept():
    block = make_block()
    x = torch.randn(B, T, E)
    pad = padding_mask(B, T, right=[(1, 2)])
    cache = BirdEyeCache()
    with torch.no_grad():
        steps = decode(block, x, cache, [4, 1, 1, 1], pad)
    real = ~pad  # padding rows carry no meaning
    torch.testing.assert_close(steps.double()[real], reference_out(block, x, pad)[real], atol=1e-5, rtol=1e-5)
    # a wrong cached R changes the next step: the cache is read, not recomputed
    cache = BirdEyeCache()
    with torch.no_grad():
        decode(block, x, cache, [4])
        cache.get(block)["r"].fill_(0.5)
        wrong = block(x[:, 4:5], cache=cache)
    assert not torch.allclose(wrong.double(), reference_out(block, x)[:, 4:5], atol=1e-3)


def test_reorder_continues_as_the_full_forward_of_the_reordered_batch():
    block = make_block()
    x = torch.randn(B, T, E)
    order = torch.tensor([2, 0, 0])
    cache = BirdEyeCache()
    with torch.no_grad():
        decode(block, x, cache, [3])
        cache.reorder(order)
        rest = decode(block, x[order, 3:], cache, [1] * (T - 3))
    torch.testing.assert_close(rest.double(), reference_out(block, x[order])[:, 3:], atol=1e-5, rtol=1e-5)


def test_nano_gpt_style_sampling_with_the_cache_equals_recomputing_the_prefix():
    torch.manual_seed(1)
    vocab, dim = 20, E
    embed, positions, head = torch.nn.Embedding(vocab, dim), torch.nn.Embedding(16, dim), torch.nn.Linear(dim, vocab)
    blocks = [make_block(seed) for seed in range(2)]

    def logits(ids, cache=None):
        start = 0 if cache is None else len(cache)
        h = embed(ids) + positions(torch.arange(start, start + ids.size(1)))
        for block in blocks:
            h = h + block(h, cache=cache)
        return head(h)[:, -1]

    prompt = torch.randint(0, vocab, (2, 3))
    with torch.no_grad():
        recomputed, cached, cache = prompt, prompt, BirdEyeCache()
        step_input = prompt
        for _ in range(6):
            recomputed = torch.cat([recomputed, logits(recomputed).argmax(-1, keepdim=True)], dim=1)
            step_input = logits(step_input, cache).argmax(-1, keepdim=True)
            cached = torch.cat([cached, step_input], dim=1)
    assert torch.equal(cached, recomputed)
