"""Transformer-XL incremental generation: step-by-step logits equal the full forward of each prefix (a new
stream, no memory), with same_length and clamp_len; beam reordering of the cache; a prompt after an explicit
memory; and fairseq-generate (--task language_modeling, beam search with a prefix) through the real CLI,
its per-token scores checked against the full forward."""

import math
import os
import re

import pytest
import torch
from fairseq.data import Dictionary

from cli_utils import COMMON_TRAIN, TINY_LM, USER_DIR, binarise_wikitext2, generate_in_process, session_corpus, train_in_process

from bet_fairseq.models.transformer_xl_lm import TransformerXLConfig, TransformerXLDecoder


def tiny_txl(mem_len=4, same_length=False, clamp_len=-1, dtype=torch.double, layers=3):
    d = Dictionary()
    for i in range(30):
        d.add_symbol(f"w{i}")
    cfg = TransformerXLConfig(decoder_embed_dim=16, decoder_ffn_embed_dim=32, decoder_layers=layers,
                              decoder_attention_heads=2, dropout=0.1, mem_len=mem_len, same_length=same_length,
                              clamp_len=clamp_len)
    torch.manual_seed(3)
    dec = TransformerXLDecoder(cfg, d).to(dtype).eval()
    for p in dec.parameters():  # larger than the initial values, so every term moves the logits
        p.data.add_(0.3 * torch.randn_like(p))
    return dec, d


def full_logits(dec, tokens):
    """The full forward of the whole prefix as a new stream (segment 0: no memory)."""
    return dec(tokens, segment_index=torch.tensor(0))[0]


def decode_steps(dec, tokens, first=1, state=None):
    """fairseq's convention: the whole prefix each call; the first call takes ``first`` tokens at once."""
    state = {} if state is None else state
    outs = [dec(tokens[:, :first], incremental_state=state)[0]]
    for t in range(first + 1, tokens.size(1) + 1):
        outs.append(dec(tokens[:, :t], incremental_state=state)[0])
    return torch.cat(outs, dim=1), state


# float64 models, but the attention's softmax runs in float32 (bet_fairseq.core.masks): 1e-6, not 1e-12
SETTINGS = [dict(), dict(same_length=True, mem_len=3), dict(clamp_len=2), dict(same_length=True, mem_len=4, clamp_len=1),
            dict(same_length=True, mem_len=1)]
IDS = ["plain", "same_length", "clamp_len", "same_length+clamp_len", "same_length_1"]


@pytest.mark.parametrize("settings", SETTINGS, ids=IDS)
@pytest.mark.parametrize("first", [1, 4])
def test_steps_equal_full_forward_float64(settings, first):
    dec, d = tiny_txl(**settings)
    tokens = torch.randint(d.nspecial, len(d), (2, 11))
    want = full_logits(dec, tokens)
    got, state = decode_steps(dec, tokens, first)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert dec.memory is not None  # from full_logits: generation neither used nor changed it
    keys = [layer.self_attn._get_input_buffer(state)["prev_key"] for layer in dec.layers]
    if settings.get("same_length"):  # bounded cache: the last mem_len - 1 positions
        assert all(k.size(2) == settings["mem_len"] - 1 for k in keys)
    else:
        assert all(k.size(2) == tokens.size(1) for k in keys)


def test_settings_change_the_logits():
    """The cases above are not vacuous: same_length and clamp_len each change the logits of long prefixes."""
    tokens = torch.randint(3, 30, (2, 11))
    plain = full_logits(tiny_txl()[0], tokens)
    for settings in SETTINGS[1:4]:
        assert not torch.allclose(full_logits(tiny_txl(**settings)[0], tokens)[:, -1], plain[:, -1])


@pytest.mark.parametrize("settings", SETTINGS[:4], ids=IDS[:4])
def test_steps_equal_full_forward_float32(settings):
    dec, d = tiny_txl(dtype=torch.float, **settings)
    tokens = torch.randint(d.nspecial, len(d), (3, 12))
    with torch.no_grad():
        torch.testing.assert_close(decode_steps(dec, tokens, 3)[0], full_logits(dec, tokens), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("settings", SETTINGS[:2], ids=IDS[:2])
def test_beam_reorder_then_step_equals_full_forward_of_reordered_prefixes(settings):
    dec, d = tiny_txl(**settings)
    tokens = torch.randint(d.nspecial, len(d), (3, 6))
    _, state = decode_steps(dec, tokens)
    new_order = torch.tensor([2, 0, 0])
    dec.reorder_incremental_state_scripting(state, new_order)
    nxt = torch.randint(d.nspecial, len(d), (3, 3))
    prefix = torch.cat([tokens.index_select(0, new_order), nxt], dim=1)
    got = torch.cat([dec(prefix[:, :t], incremental_state=state)[0] for t in (7, 8, 9)], dim=1)
    torch.testing.assert_close(got, full_logits(dec, prefix)[:, 6:], rtol=1e-6, atol=1e-6)
    # a finished hypothesis leaves the batch: the cache shrinks with it
    dec.reorder_incremental_state_scripting(state, torch.tensor([1]))
    last = torch.cat([prefix[1:2], torch.randint(d.nspecial, len(d), (1, 1))], dim=1)
    torch.testing.assert_close(dec(last, incremental_state=state)[0], full_logits(dec, last)[:, -1:],
                               rtol=1e-6, atol=1e-6)


def test_prompt_after_an_explicit_memory():
    dec, d = tiny_txl(mem_len=5)
    stream = torch.randint(d.nspecial, len(d), (2, 12))
    _, extra = dec(stream[:, :5], segment_index=torch.tensor(0))
    memory = [h.detach() for h in extra["layer_inputs"]]
    want = dec(stream[:, 5:], memory=memory)[0]
    state = {}
    got = [dec(stream[:, 5:8], incremental_state=state, memory=memory)[0]]
    got += [dec(stream[:, 5:t], incremental_state=state)[0] for t in range(9, 13)]
    torch.testing.assert_close(torch.cat(got, dim=1), want, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="first incremental call only"):
        dec(stream[:, 5:], incremental_state=state, memory=memory)
    with pytest.raises(ValueError, match="whole prefix each call"):
        dec(stream[:, 5:12], incremental_state=state)


# ---------------------------------------------------------------- fairseq-generate through the real CLI
@pytest.fixture(scope="module")
def lm_data(tmp_path_factory):
    return session_corpus(tmp_path_factory, binarise_wikitext2)


def short_lines_split(lm_data, folder, n=6):
    """A test split of ``n`` lines of 4 to 40 tokens (the corpus's own dictionary): fairseq's beam search
    fails on a prefix that starts with eos (an empty line), which is not what this test is about."""
    import shutil

    from fairseq.data import data_utils, indexed_dataset

    d = Dictionary.load(os.path.join(lm_data, "dict.txt"))
    lines = [t for t in data_utils.load_indexed_dataset(os.path.join(lm_data, "test"), d) if 5 <= len(t) <= 41][:n]
    os.makedirs(folder)
    shutil.copy(os.path.join(lm_data, "dict.txt"), folder)
    builder = indexed_dataset.make_builder(os.path.join(folder, "test.bin"), impl="mmap", vocab_size=len(d))
    for t in lines:
        builder.add_item(t)
    builder.finalize(os.path.join(folder, "test.idx"))
    return str(folder), len(lines)


def test_fairseq_generate_beam_with_prefix(lm_data, tmp_path):
    """Train a tiny Transformer-XL (segments, memory) for a few updates, then fairseq-generate with
    --task language_modeling, beam 3 and a 3-token prefix: every line gets a hypothesis that starts with its
    prefix, and its per-token scores (P- lines, base 2) are those of the full forward of [eos ; hypothesis]."""
    from fairseq import checkpoint_utils

    checkpoint = train_in_process(lm_data, tmp_path, "--arch", "transformer_xl_lm", *TINY_LM, *COMMON_TRAIN,
                                  "--task", "bet_truncated_bptt_lm", "--tokens-per-sample", "16", "--batch-size", "4",
                                  "--mem-len", "4", "--clamp-len", "6", "--disable-validation", updates=2)
    data, n_lines = short_lines_split(lm_data, tmp_path / "short")
    out = generate_in_process([
        data, "--user-dir", USER_DIR, "--path", checkpoint, "--task", "language_modeling", "--cpu",
        "--gen-subset", "test", "--sample-break-mode", "eos", "--batch-size", "4",
        "--beam", "3", "--prefix-size", "3", "--max-len-b", "8", "--model-overrides", "{'same_length': True}"])
    targets = dict(re.findall(r"^T-(\d+)\t(.*)$", out, re.M))
    hypos = re.findall(r"^H-(\d+)\t(\S+)\t(.*)$", out, re.M)
    scores = dict(re.findall(r"^P-(\d+)\t(.*)$", out, re.M))
    assert len(hypos) == n_lines == 6, out[-2000:]

    models, _ = checkpoint_utils.load_model_ensemble([checkpoint], arg_overrides={"data": lm_data, "same_length": True})
    dec = models[0].decoder.eval()
    assert dec.layers[0].self_attn.same_length == 4  # the window is shorter than the hypotheses: it matters
    d = dec.dictionary
    for sample_id, _, hypo in hypos:
        assert hypo.split()[:3] == targets[sample_id].replace("<<unk>>", "<unk>").split()[:3] and len(hypo.split()) > 4
        ids = d.encode_line(hypo, add_if_not_exist=False, append_eos=True).long().unsqueeze(0)
        inputs = torch.cat([torch.tensor([[d.eos()]]), ids[:, :-1]], dim=1)
        with torch.no_grad():
            lprobs = torch.log_softmax(dec(inputs, segment_index=torch.tensor(0))[0].float(), dim=-1)
        want = lprobs[0].gather(-1, ids[0].unsqueeze(-1)).squeeze(-1) / math.log(2)
        got = torch.tensor([float(s) for s in scores[sample_id].split()])
        torch.testing.assert_close(got, want, rtol=0, atol=2e-4)
