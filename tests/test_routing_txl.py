"""Routing Transformer and Transformer-XL baselines: modules against naive loop references, causality,
centroid EMA, memory recurrence and stop-gradient, the contiguous-segment task, and real CLI runs."""

import math
import re

import numpy as np
import pytest
import torch

from cli_utils import COMMON_TRAIN, TINY_LM, USER_DIR, binarise_wikitext2, cli, cli_in_process

import bet_fairseq  # noqa: F401
from bet_fairseq.models.transformer_xl_lm import TransformerXLConfig, TransformerXLDecoder
from bet_fairseq.modules.relative_attention import RelativeMultiheadAttention
from bet_fairseq.modules.routing_attention import RoutingMultiheadAttention
from fairseq.data import Dictionary


# ---------------------------------------------------------------------------------------------
# naive references (python loops / numpy, written from the papers' formulas)

def np_linear(x, lin):
    w = lin.weight.detach().double().numpy()
    b = 0.0 if lin.bias is None else lin.bias.detach().double().numpy()
    return x @ w.T + b


def ref_route(vec, centroids):
    """Layer-norm (no affine, eps 1e-5), unit-normalise, nearest centroid by cosine."""
    mu = sum(vec) / len(vec)
    var = sum((a - mu) ** 2 for a in vec) / len(vec)
    z = [(a - mu) / math.sqrt(var + 1e-5) for a in vec]
    norm = math.sqrt(sum(a * a for a in z))
    z = [a / norm for a in z]
    sims = [sum(a * c for a, c in zip(z, cen)) for cen in centroids]
    return int(np.argmax(sims)), np.array(z)


def ref_routing_attention(x, m):
    """x (T, B, E) numpy; m a RoutingMultiheadAttention. Returns out (T, B, E), probs (B, H, T, T)."""
    T, B, E = x.shape
    H, d = m.num_heads, m.head_dim
    q, k, v = (np_linear(x, lin).reshape(T, B, H, d) for lin in (m.q_proj, m.k_proj, m.v_proj))
    cents = m.centroids.double().numpy()
    probs = np.zeros((B, H, T, T))
    heads_out = np.zeros((T, B, H, d))
    for b in range(B):
        for h in range(H):
            routed = h >= m.local_heads
            if routed:
                cq = [ref_route(list(q[i, b, h]), cents[h - m.local_heads])[0] for i in range(T)]
                ck = [ref_route(list(k[j, b, h]), cents[h - m.local_heads])[0] for j in range(T)]
            for i in range(T):
                allowed = []
                for j in range(i + 1):
                    ok = (cq[i] == ck[j] or i == j) if routed else (i - j < m.window)
                    if ok:
                        allowed.append(j)
                s = np.array([q[i, b, h] @ k[j, b, h] / math.sqrt(d) for j in allowed])
                p = np.exp(s - s.max())
                p /= p.sum()
                for pj, j in zip(p, allowed):
                    probs[b, h, i, j] = pj
                    heads_out[i, b, h] += pj * v[j, b, h]
    out = np_linear(heads_out.reshape(T, B, E), m.out_proj)
    return out, probs


def make_routing(E=16, H=4, routing_heads=2, clusters=3, window=3, decay=0.5, seed=0):
    torch.manual_seed(seed)
    m = RoutingMultiheadAttention(E, H, num_clusters=clusters, window=window, routing_heads=routing_heads,
                                  ema_decay=decay).double()
    m.centroids_initialized.fill_(True)  # fixed (random) centroids: no k-means init
    return m


# ---------------------------------------------------------------------------------------------
# routing attention

@pytest.mark.parametrize("routing_heads", [2, 4])
def test_routing_attention_matches_loop_reference(routing_heads):
    m = make_routing(routing_heads=routing_heads).eval()
    x = torch.randn(9, 2, 16, dtype=torch.double)
    out_ref, probs_ref = ref_routing_attention(x.numpy(), m)
    out, w = m(x, x, x, need_weights=True, need_head_weights=True)
    torch.testing.assert_close(out, torch.from_numpy(out_ref))
    torch.testing.assert_close(w.transpose(0, 1), torch.from_numpy(probs_ref))
    m.use_fused_attention = True
    fused, _ = m(x, x, x, need_weights=False)
    torch.testing.assert_close(fused, torch.from_numpy(out_ref))
    # the example is not trivial: routing excludes some past keys and keeps some non-diagonal ones
    routed = probs_ref[:, m.local_heads :]
    lower = np.tril(np.ones((9, 9)), -1).astype(bool)
    assert (routed[..., lower] == 0).any() and (routed[..., lower] > 0).any()


@pytest.mark.parametrize("training", [False, True])
def test_routing_attention_is_causal(training):
    m = make_routing(routing_heads=3, clusters=2, window=2)
    m.dropout_module.p = 0.0
    m.train(training)
    state = {k: v.clone() for k, v in m.state_dict().items()}
    x = torch.randn(12, 3, 16, dtype=torch.double)
    y = x.clone()
    y[7] += 3 * torch.randn(3, 16, dtype=torch.double)  # perturb a future token
    out_x, _ = m(x, x, x, need_weights=False)
    m.load_state_dict(state)  # same centroids for the second forward
    out_y, _ = m(y, y, y, need_weights=False)
    torch.testing.assert_close(out_x[:7], out_y[:7])
    assert not torch.allclose(out_x[7], out_y[7])


def test_routing_incremental_matches_full_sequence():
    m = make_routing().eval()
    x = torch.randn(6, 2, 16, dtype=torch.double)
    full, _ = m(x, x, x, need_weights=False)
    state = {}
    steps = [m(x[t : t + 1], x[t : t + 1], x[t : t + 1], incremental_state=state, need_weights=False)[0]
             for t in range(6)]
    torch.testing.assert_close(torch.cat(steps), full)


def test_centroid_ema_update_matches_hand_computation():
    decay = 0.7
    m = make_routing(E=12, H=2, routing_heads=1, clusters=3, decay=decay, seed=3).train()
    before = m.centroids.clone().numpy()[0]
    x = torch.randn(5, 2, 12, dtype=torch.double)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, 3:] = True  # two padded positions of batch row 1 must not count
    m(x, x, x, key_padding_mask=pad, need_weights=False)
    q = np_linear(x.numpy(), m.q_proj).reshape(5, 2, 2, 6)[:, :, 1]
    k = np_linear(x.numpy(), m.k_proj).reshape(5, 2, 2, 6)[:, :, 1]
    members = {c: [] for c in range(3)}
    for b in range(2):
        for t in range(5):
            if pad[b, t]:
                continue
            for vec in (q[t, b], k[t, b]):
                c, z = ref_route(list(vec), before)
                members[c].append(z)
    expected = before.copy()
    for c, zs in members.items():
        if zs:
            new = decay * before[c] + (1 - decay) * np.mean(zs, axis=0)
            expected[c] = new / np.linalg.norm(new)
    assert sum(len(z) for z in members.values()) == 2 * 8
    np.testing.assert_allclose(m.centroids[0].numpy(), expected, rtol=1e-6, atol=1e-9)
    m.eval()
    m(x, x, x, need_weights=False)  # no update outside training
    np.testing.assert_allclose(m.centroids[0].numpy(), expected, rtol=1e-6, atol=1e-9)


def test_first_training_batch_initialises_centroids():
    torch.manual_seed(0)
    m = RoutingMultiheadAttention(16, 4, num_clusters=3, window=2).train()
    x = torch.randn(8, 2, 16)
    m(x, x, x, need_weights=False)
    assert bool(m.centroids_initialized)
    torch.testing.assert_close(m.centroids.norm(dim=-1), torch.ones(2, 3))


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_clusters=0), "--routing-clusters must be an integer >= 1"),
    (dict(window=0), "--routing-window must be an integer >= 1"),
    (dict(routing_heads=5), "--routing-heads must be an integer between 0 and the number of heads (4)"),
    (dict(ema_decay=1.0), "--routing-ema-decay must be a number in [0, 1)"),
])
def test_bad_routing_options_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        RoutingMultiheadAttention(16, 4, **kwargs)


# ---------------------------------------------------------------------------------------------
# Transformer-XL relative attention

def ref_relative_attention(x, mem, m):
    """Dai et al. eq. (section 3.3) with explicit loops: A_ij = q_i.k_j + q_i.W_R R_{i-j} + u.k_j + v.W_R R_{i-j}."""
    B, T, E = x.shape
    M = 0 if mem is None else mem.shape[1]
    ctx = x if mem is None else np.concatenate([mem, x], axis=1)
    H, d = m.num_heads, m.head_dim
    q = np_linear(x, m.q_proj).reshape(B, T, H, d)
    k = np_linear(ctx, m.k_proj).reshape(B, M + T, H, d)
    v = np_linear(ctx, m.v_proj).reshape(B, M + T, H, d)
    u, vb = m.u_bias.detach().double().numpy(), m.v_bias.detach().double().numpy()

    def R(dist):
        return np.array([math.sin(dist / 10000 ** (2 * f / E)) for f in range(E // 2)]
                        + [math.cos(dist / 10000 ** (2 * f / E)) for f in range(E // 2)])

    out = np.zeros((B, T, H, d))
    probs = np.zeros((B, H, T, M + T))
    for b in range(B):
        for h in range(H):
            for i in range(T):
                scores = []
                for j in range(M + i + 1):
                    r = np_linear(R(M + i - j), m.r_proj).reshape(H, d)[h]
                    a = q[b, i, h] @ k[b, j, h] + q[b, i, h] @ r + u[h] @ k[b, j, h] + vb[h] @ r
                    scores.append(a / math.sqrt(d))
                p = np.exp(np.array(scores) - max(scores))
                p /= p.sum()
                probs[b, h, i, : M + i + 1] = p
                out[b, i, h] = p @ v[b, : M + i + 1, h]
    return np_linear(out.reshape(B, T, E), m.out_proj), probs


@pytest.mark.parametrize("mem_len", [0, 3])
def test_relative_attention_matches_loop_reference(mem_len):
    torch.manual_seed(1)
    m = RelativeMultiheadAttention(8, 2).double().eval()
    for p in (m.u_bias, m.v_bias):
        torch.nn.init.normal_(p)  # make the biases matter
    x = torch.randn(2, 4, 8, dtype=torch.double)
    mem = torch.randn(2, mem_len, 8, dtype=torch.double) if mem_len else None
    out, probs = m(x, mem)
    out_ref, probs_ref = ref_relative_attention(x.numpy(), None if mem is None else mem.numpy(), m)
    torch.testing.assert_close(out, torch.from_numpy(out_ref))
    torch.testing.assert_close(probs, torch.from_numpy(probs_ref))


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


# ---------------------------------------------------------------------------------------------
# contiguous segments and the real CLIs

@pytest.fixture(scope="module")
def lm_data(tmp_path_factory):
    return binarise_wikitext2(str(tmp_path_factory.mktemp("lm")), n_train=200, n_valid=40, n_test=40)


def test_segments_are_contiguous_rows(lm_data):
    from fairseq.data import data_utils
    from bet_fairseq.tasks.truncated_bptt import TruncatedBPTTConfig, TruncatedBPTTLanguageModelingTask

    task = TruncatedBPTTLanguageModelingTask.setup_task(TruncatedBPTTConfig(data=lm_data, tokens_per_sample=7, batch_size=3))
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


def eval_ppl(text):
    return float(re.search(r"Perplexity: ([\d.]+)", text).group(1))


TXL_FLAGS = ["--task", "bet_truncated_bptt_lm", "--tokens-per-sample", "32", "--batch-size", "4"]
ROUTING_FLAGS = ["--task", "language_modeling", "--tokens-per-sample", "32", "--max-tokens", "512",
                 "--routing-clusters", "3", "--routing-window", "8"]


def test_transformer_xl_cli_train_and_eval_lm(lm_data, tmp_path):
    save = tmp_path / "txl"
    cli("fairseq-train", lm_data, "--user-dir", USER_DIR, "--arch", "transformer_xl_lm", *TINY_LM, *COMMON_TRAIN,
        *TXL_FLAGS, "--mem-len", "32", "--max-update", "3", "--save-dir", save)
    state = torch.load(save / "checkpoint_last.pt", weights_only=True)
    model_cfg = state["cfg"]["model"]
    assert (model_cfg["mem_len"] if isinstance(model_cfg, dict) else model_cfg.mem_len) == 32
    assert not any("memory" in k for k in state["model"])
    out = cli("fairseq-eval-lm", lm_data, "--user-dir", USER_DIR, "--path", save / "checkpoint_last.pt",
              *TXL_FLAGS, "--cpu", "--gen-subset", "test", "--model-overrides", "{'mem_len': 64}")
    assert 1 < eval_ppl(out.stdout + out.stderr) < 1e6


def test_routing_cli_train_and_eval_lm(lm_data, tmp_path):
    from fairseq_cli import eval_lm

    save = tmp_path / "routing"
    cli("fairseq-train", lm_data, "--user-dir", USER_DIR, "--arch", "routing_lm", *TINY_LM, *COMMON_TRAIN,
        *ROUTING_FLAGS, "--max-update", "3", "--save-dir", save)
    state = torch.load(save / "checkpoint_last.pt", weights_only=True)
    cents = state["model"]["decoder.layers.0.self_attn.centroids"]
    assert cents.shape == (2, 3, 8) and bool(state["model"]["decoder.layers.0.self_attn.centroids_initialized"])
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_eval_lm_parser(), list(map(str, [
        lm_data, "--user-dir", USER_DIR, "--path", save / "checkpoint_last.pt", "--tokens-per-sample", "32",
        "--max-tokens", "512", "--cpu", "--gen-subset", "test"])))
    result = eval_lm.main(convert_namespace_to_omegaconf(args))
    assert 1 < result["perplexity"] < 1e6


def test_every_size_trains_and_bad_options_fail(lm_data, tmp_path):
    from fairseq import options
    from fairseq_cli import train

    for arch, flags in (("routing_lm_wikitext103", ROUTING_FLAGS), ("routing_lm_enwik8", ROUTING_FLAGS),
                        ("transformer_xl_lm_wikitext103", TXL_FLAGS), ("transformer_xl_lm_enwik8", TXL_FLAGS)):
        cli_in_process(train, [lm_data, "--user-dir", USER_DIR, "--arch", arch, *TINY_LM, *COMMON_TRAIN, *flags,
                           "--max-update", "2", "--save-dir", tmp_path / arch, "--no-save"])
    # the architectures carry the sizes of the other LM rows when no size flag is given
    expected = {"routing_lm": (300, 4, 1200), "routing_lm_wikitext103": (300, 6, 1200),
                "routing_lm_enwik8": (512, 4, 2048), "transformer_xl_lm": (300, 4, 1200),
                "transformer_xl_lm_wikitext103": (300, 6, 1200), "transformer_xl_lm_enwik8": (512, 4, 2048)}
    for arch, sizes in expected.items():
        task = "bet_truncated_bptt_lm" if "xl" in arch else "language_modeling"
        args = options.parse_args_and_arch(options.get_training_parser(),
                                           [lm_data, "--user-dir", USER_DIR, "--task", task, "--arch", arch])
        assert (args.decoder_embed_dim, args.decoder_attention_heads, args.decoder_ffn_embed_dim,
                args.decoder_layers) == (*sizes, 6), arch
    for argv, message in (
        (["--arch", "routing_lm", *ROUTING_FLAGS, "--routing-heads", "9"], "--routing-heads must be an integer"),
        (["--arch", "transformer_xl_lm", *TXL_FLAGS, "--mem-len", "-1"], "--mem-len must be an integer >= 0"),
        (["--arch", "transformer_xl_lm", "--task", "language_modeling", "--tokens-per-sample", "32",
          "--max-tokens", "512"], "needs --task bet_truncated_bptt_lm"),
        (["--arch", "transformer_xl_lm", "--task", "bet_truncated_bptt_lm", "--max-tokens", "512"],
         "needs --batch-size"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            cli_in_process(train, [lm_data, "--user-dir", USER_DIR, *TINY_LM, *COMMON_TRAIN, *argv,
                               "--max-update", "1", "--save-dir", tmp_path / "bad", "--no-save"])


def test_options_are_listed_in_help():
    from bet_fairseq.cli_help import _HELP_GROUPS
    from bet_fairseq.models.routing_lm import RoutingAttentionConfig

    assert RoutingAttentionConfig in [dc for _, dc in _HELP_GROUPS]
    assert TransformerXLConfig in [dc for _, dc in _HELP_GROUPS]
