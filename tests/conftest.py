"""Shared test set-up: the plugin registered as ``--user-dir`` would, the real corpora, and small helpers
that several test folders use (the attention builder and fairseq's causal float mask)."""

import os
import sys

import pytest
import torch

# One intra-op thread, as the subprocess runs get (OMP_NUM_THREADS=1): the tests' models are tiny, and on
# a busy 2-core machine torch's threads waiting for each other made them up to 10x slower.
torch.set_num_threads(1)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_DATA = os.path.join(os.path.dirname(ROOT), "shared", "data")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bet_fairseq  # noqa: E402

bet_fairseq.register()  # what fairseq's --user-dir import does; tests build models in process too


def pytest_configure(config):
    config.addinivalue_line("markers", "install_profiles: builds fresh virtual environments and installs the project "
                                       "(minutes; runs only with BET_TEST_INSTALL_PROFILES=1)")


@pytest.fixture(scope="session")
def shared_data():
    if not os.path.isdir(SHARED_DATA):
        pytest.skip(f"real corpora not found at {SHARED_DATA}")
    return SHARED_DATA


def future_mask(n: int) -> torch.Tensor:
    """fairseq's causal mask for ``n`` positions: 0 on and below the diagonal, -inf above."""
    return torch.triu(torch.full((n, n), float("-inf")), 1)


def make_attention(mode: str, embed_dim: int, num_heads: int, seed: int = 0, dropout: float = 0.0, **options):
    """A registered variant in eval mode, its options given as keyword arguments (dataclass fields)."""
    from bet_fairseq.attention import VARIANTS

    cls = VARIANTS[mode]
    torch.manual_seed(seed)
    opts = None if cls.options_class is None else cls.options_class(**options)
    if cls.options_class is None and options:
        raise TypeError(f"variant {mode!r} takes no options, got {options}")
    return cls(embed_dim, num_heads, options=opts, dropout=dropout).eval()


def full_forward(m, x, key_padding_mask=None, **kwargs):
    """A self-attention module over the whole (T, B, E) ``x`` with the causal mask, as a decoder calls it."""
    return m(x, x, x, key_padding_mask=key_padding_mask, attn_mask=future_mask(x.size(0)), **kwargs)


def decode(m, x, state=None, key_padding_mask=None, **kwargs):
    """``x`` fed one position at a time through ``incremental_state`` (what beam search does); returns the
    (T, B, E) outputs, the per-step weights and the state. ``key_padding_mask`` (B, T) covers ``x``."""
    state = {} if state is None else state
    outs, weights = [], []
    for t in range(x.size(0)):
        xt = x[t:t + 1]
        kpm = None if key_padding_mask is None else key_padding_mask[:, t:t + 1]
        out, w = m(xt, xt, xt, key_padding_mask=kpm, incremental_state=state, **kwargs)
        outs.append(out)
        weights.append(w)
    return torch.cat(outs), weights, state


def assert_incremental_equals_full(m, x, atol=1e-5, rtol=1e-5):
    """Decoding ``x`` step by step gives the full causal forward; returns the decoding state."""
    full, _ = full_forward(m, x, need_weights=False)
    steps, _, state = decode(m, x)
    torch.testing.assert_close(steps, full, atol=atol, rtol=rtol)
    return state


def assert_reorder_continues(m, x, order, prefix=3, atol=1e-5, rtol=1e-5):
    """Decode ``prefix`` steps, reorder the cache as beam search does, decode the rest: the result is the
    full forward of the reordered batch. Every cached tensor must be batch-first and reordered."""
    _, _, state = decode(m, x[:prefix])
    before = {k: v.clone() for k, v in m._get_input_buffer(state).items() if v is not None}
    assert before and all(v.size(0) == x.size(1) for v in before.values()), "the cache is batch-first"
    m.reorder_incremental_state(state, order)
    after = {k: v for k, v in m._get_input_buffer(state).items() if v is not None}
    assert sorted(after) == sorted(before)
    for name, value in before.items():
        assert torch.equal(after[name], value.index_select(0, order)), f"{name} was not reordered"
    x2 = x[:, order]
    outs, _, _ = decode(m, x2[prefix:], state)
    full, _ = full_forward(m, x2, need_weights=False)
    torch.testing.assert_close(outs, full[prefix:], atol=atol, rtol=rtol)
    return before


def make_sharp(mode: str, embed_dim: int, num_heads: int, seed: int = 0, **options):
    """``make_attention`` with a variant's own parameters drawn far from their init so that they matter
    visibly (BET's w, the localness window's U, Transformer-XL's u and v biases)."""
    m = make_attention(mode, embed_dim, num_heads, seed=seed, **options)
    params = dict(m.named_parameters())
    with torch.no_grad():
        for name, std in (("bet_w", 0.5), ("localness_u.weight", 2.0), ("u_bias", 1.0), ("v_bias", 1.0)):
            if name in params:
                params[name].normal_(0, std)
    return m


def assert_decoding_consistent(m, x, order, prefix=3):
    """Both decoding checks; returns the full decoding state and the cache as it was before the reorder."""
    return assert_incremental_equals_full(m, x), assert_reorder_continues(m, x, order, prefix)


def padding_mask(batch: int, length: int, left=(), right=()) -> torch.Tensor:
    """(B, T) key padding mask: ``left`` / ``right`` are (row, count) pairs of leading / trailing padding."""
    kpm = torch.zeros(batch, length, dtype=torch.bool)
    for row, count in left:
        kpm[row, :count] = True
    for row, count in right:
        kpm[row, length - count:] = True
    return kpm


def assert_matches_reference(m, x, key_padding_mask=None, atol=1e-5, rtol=1e-5):
    """The module's (fast-path) full forward against tests/reference.py; returns the reference."""
    from reference import reference_for

    ref = reference_for(m, x, key_padding_mask)
    out, _ = full_forward(m, x, key_padding_mask, need_weights=False)
    torch.testing.assert_close(out.to(ref.out.dtype), ref.out, atol=atol, rtol=rtol)
    return ref
