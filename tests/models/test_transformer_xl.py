"""Transformer-XL: the segment memory (recurrence equals one long pass, stop-gradient, reset), the
contiguous segments of --task bet_truncated_bptt_lm, fairseq-train + fairseq-eval-lm, and bad options.
Its relative attention against the paper's equation is tested with the other variants (tests/attention)."""

import re

import pytest
import torch
from fairseq.data import Dictionary

from cli_utils import (
    COMMON_TRAIN, TINY_LM, USER_DIR, binarise_wikitext2, eval_lm_in_process, session_corpus, train_in_process,
)

from bet_fairseq.models.transformer_xl_lm import TransformerXLConfig, TransformerXLDecoder


def tiny_txl(mem_len, dropout=0.0):
    d = Dictionary()
    for i in range(30):
        d.add_symbol(f"w{i}")
    cfg = TransformerXLConfig(decoder_embed_dim=16, decoder_ffn_embed_dim=32, decoder_layers=2,
                              decoder_attention_heads=2, dropout=dropout, mem_len=mem_len)
    torch.manual_seed(2)
    return TransformerXLDecoder(cfg, d).double(), d


def test_two_segments_with_memory_equal_one_long_segment():
    """Causal attention: segment 2 with a memory of segment 1's layer inputs sees exactly what the last
    positions of [seg1 ; seg2] see in one pass (same keys, same relative distances)."""
    dec, d = tiny_txl(mem_len=6)
    dec.eval()
    tokens = torch.randint(d.nspecial, len(d), (2, 11))
    whole, _ = dec(tokens, segment_index=torch.tensor(0))
    first, _ = dec(tokens[:, :6], segment_index=torch.tensor(0))
    second, _ = dec(tokens[:, 6:], segment_index=torch.tensor(1))
    torch.testing.assert_close(torch.cat([first, second], dim=1), whole)
    # by construction: an explicit memory of segment 1's layer inputs gives the same as the kept one
    _, extra = dec(tokens[:, :6], memory=None, segment_index=torch.tensor(0))
    explicit, _ = dec(tokens[:, 6:], memory=[h.detach() for h in extra["layer_inputs"]])
    torch.testing.assert_close(explicit, second)
    # a new stream (segment 0) forgets the memory; a shorter memory sees less
    restart, _ = dec(tokens[:, 6:], segment_index=torch.tensor(0))
    dec.reset_memory()
    torch.testing.assert_close(restart, dec(tokens[:, 6:])[0])
    assert not torch.allclose(restart, second)
    short, _ = tiny_txl(mem_len=2)
    short.eval()
    short(tokens[:, :6], segment_index=torch.tensor(0))
    assert [m.size(1) for m in short.memory] == [2, 2]
    with_short, _ = short(tokens[:, 6:], segment_index=torch.tensor(1))
    assert not torch.allclose(with_short[:, -1], whole[:, -1])


def test_memory_is_stop_gradient_and_reset():
    dec, d = tiny_txl(mem_len=4, dropout=0.1)
    dec.train()
    tokens = torch.randint(d.nspecial, len(d), (3, 10))
    out1, _ = dec(tokens[:, :5], segment_index=torch.tensor(0))
    assert all(not m.requires_grad and m.grad_fn is None for m in dec.memory)
    out2, _ = dec(tokens[:, 5:], segment_index=torch.tensor(1))
    out2.sum().backward()
    # segment 1's graph is untouched by segment 2's backward: no gradient flowed through the memory
    out1.sum().backward()
    assert dec.memory is not None
    dec.eval()  # train -> eval: a different stream, the memory is cleared
    assert dec.memory is None
    dec(tokens[:, :5], segment_index=torch.tensor(0))
    dec(tokens[:2, 5:], segment_index=torch.tensor(1))  # batch size changed: memory not reused
    assert dec.memory[0].size(0) == 2


# ---------------------------------------------------------------- contiguous segments and the real CLIs
@pytest.fixture(scope="module")
def lm_data(tmp_path_factory):
    return session_corpus(tmp_path_factory, binarise_wikitext2)


def test_segments_are_contiguous_rows(lm_data):
    from fairseq.data import data_utils
    from bet_fairseq.tasks.truncated_bptt import TruncatedBPTTConfig, TruncatedBPTTLanguageModelingTask

    task = TruncatedBPTTLanguageModelingTask.setup_task(
        TruncatedBPTTConfig(data=lm_data, tokens_per_sample=7, batch_size=3))
    task.load_dataset("test")
    itr = task.get_batch_iterator(task.dataset("test")).next_epoch_itr(shuffle=False)
    batches = list(itr)
    raw = data_utils.load_indexed_dataset(f"{lm_data}/test", task.dictionary)
    stream = [int(t) for i in range(len(raw)) for t in raw[i]]
    length = len(stream) // 3
    assert [int(b["net_input"]["segment_index"]) for b in batches] == list(range(len(batches)))
    for row in range(3):
        inputs = [int(t) for b in batches for t in b["net_input"]["src_tokens"][row]]
        targets = [int(t) for b in batches for t in b["target"][row]]
        expected = stream[row * length : (row + 1) * length]
        assert inputs == expected[:-1] and targets == expected[1:]


TXL_TASK = ["--task", "bet_truncated_bptt_lm", "--tokens-per-sample", "32", "--batch-size", "4"]
TXL_TRAIN = [*TINY_LM, *COMMON_TRAIN, *TXL_TASK]


def test_train_and_eval_lm(lm_data, tmp_path):
    checkpoint = train_in_process(lm_data, tmp_path, "--arch", "transformer_xl_lm", *TXL_TRAIN, "--mem-len", "32")
    state = torch.load(checkpoint, weights_only=True)
    model_cfg = state["cfg"]["model"]
    assert (model_cfg["mem_len"] if isinstance(model_cfg, dict) else model_cfg.mem_len) == 32
    assert not any("memory" in k for k in state["model"])
    result = eval_lm_in_process([lm_data, "--user-dir", USER_DIR, "--path", checkpoint, *TXL_TASK, "--cpu",
                                 "--gen-subset", "test", "--model-overrides", "{'mem_len': 64}"])
    assert 1 < result["perplexity"] < 1e6
    # the reference code's evaluation settings, as the Table 2 row passes them: they reach the model
    same = eval_lm_in_process([lm_data, "--user-dir", USER_DIR, "--path", checkpoint, *TXL_TASK, "--cpu",
                               "--gen-subset", "test", "--model-overrides",
                               "{'mem_len': 64, 'same_length': True, 'clamp_len': 3}"])
    assert 1 < same["perplexity"] < 1e6 and same["perplexity"] != result["perplexity"]


@pytest.mark.parametrize("argv, message", [
    (["--arch", "transformer_xl_lm", *TXL_TRAIN, "--mem-len", "-1"], "--mem-len must be an integer >= 0"),
    (["--arch", "transformer_xl_lm", *TXL_TRAIN, "--decoder-embed-dim", "33", "--decoder-attention-heads", "3"],
     "--decoder-embed-dim must be even"),
    (["--arch", "transformer_xl_lm", *TINY_LM, *COMMON_TRAIN, "--task", "language_modeling", "--tokens-per-sample", "32",
      "--max-tokens", "512"], "needs --task bet_truncated_bptt_lm"),
    (["--arch", "transformer_xl_lm", *TINY_LM, *COMMON_TRAIN, "--task", "bet_truncated_bptt_lm", "--max-tokens", "512"],
     "needs --batch-size"),
    (["--arch", "transformer_xl_lm", *TXL_TRAIN, "--mem-len", "0", "--same-length"], "--same-length needs --mem-len >= 1"),
    (["--arch", "transformer_xl_lm", *TXL_TRAIN, "--clamp-len", "-2"], "--clamp-len must be -1 (none)"),
], ids=["mem_len", "odd_dim", "task", "batch_size", "same_length", "clamp_len"])
def test_bad_options_are_clear_errors(lm_data, tmp_path, argv, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        train_in_process(lm_data, tmp_path, *argv, "--no-save", updates=1)


def test_same_length_and_clamp_len_against_hand_built_equivalents():
    """same_length: every query sees exactly its last mem_len positions (itself included), checked against
    the unrestricted model given that window as an explicit mask; clamp_len: distances beyond it use the
    embedding of clamp_len, checked against a loop over the relative logits."""
    from bet_fairseq.core.baselines import relative_logits

    decoder, _ = tiny_txl(mem_len=4)
    attn = decoder.layers[0].self_attn.eval()
    T, M, B, E = 5, 3, 2, 16
    x, mem = torch.randn(T, B, E, dtype=torch.double), torch.randn(M, B, E, dtype=torch.double)
    ctx = torch.cat([mem, x])
    S = M + T
    window = torch.full((T, S), float("-inf"), dtype=torch.double)
    for i in range(T):
        for j in range(S):
            if M + i - 4 < j <= M + i:  # the last 4 positions up to query i
                window[i, j] = 0.0
    attn.same_length = 4
    restricted, w1 = attn(x, ctx, ctx, need_weights=True, need_head_weights=True)
    attn.same_length = None
    explicit, _ = attn(x, ctx, ctx, attn_mask=window, need_weights=False)
    torch.testing.assert_close(restricted, explicit)
    assert ((w1 > 0).sum(-1) == 4).all()  # every query: exactly 4 keys

    q, k = torch.randn(1, 2, T, 8, dtype=torch.double), torch.randn(1, 2, S, 8, dtype=torch.double)
    r, u, v = (torch.randn(2, S, 8, dtype=torch.double), torch.randn(2, 8, dtype=torch.double),
               torch.randn(2, 8, dtype=torch.double))
    got = relative_logits(q, k, r, u, v, clamp_len=2)
    for h in range(2):
        for i in range(T):
            for j in range(M + i + 1):
                d = min(M + i - j, 2)
                want = float((q[0, h, i] + u[h]) @ k[0, h, j] + (q[0, h, i] + v[h]) @ r[h, d])
                assert abs(float(got[0, h, i, j]) - want) < 1e-9
