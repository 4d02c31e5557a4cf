"""bet_fairseq.hf on small random GPT-2 and Llama (grouped-query) configs: the attention against tests/reference.py's
float64 math, cached steps and generate() against the full forward, save/load, training, and the refusals."""

from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, DynamicCache, GPT2Config, GPT2LMHeadModel  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaAttention  # noqa: E402

import bet_fairseq.core.incremental as incremental  # noqa: E402
from bet_fairseq.hf import BetGPT2Config, BetGPT2LMHeadModel, BetLlamaConfig, BetLlamaForCausalLM, to_bet  # noqa: E402
from conftest import padding_mask  # noqa: E402
from reference import reference_attention  # noqa: E402

VOCAB, DIM, HEADS, KV_HEADS, T, B = 50, 32, 4, 2, 7, 2
HEAD_DIM = DIM // HEADS


# initializer_range 0.2 (not 0.02): attention logits of order 1, so that R, the diagonal and positions move the outputs
def gpt2_fields():
    return dict(n_layer=2, n_embd=DIM, n_head=HEADS, vocab_size=VOCAB, n_positions=64, resid_pdrop=0.0,
                embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.2)


def llama_fields():
    return dict(num_hidden_layers=2, hidden_size=DIM, intermediate_size=2 * DIM, num_attention_heads=HEADS,
                num_key_value_heads=KV_HEADS, vocab_size=VOCAB, max_position_embeddings=64, initializer_range=0.2)


FAMILIES = {"gpt2": (BetGPT2Config, BetGPT2LMHeadModel, gpt2_fields),
            "llama": (BetLlamaConfig, BetLlamaForCausalLM, llama_fields)}


def sharpen(model):
    """w far from its init so that R varies visibly (BET then changes the outputs a lot)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bet_w"):
                p.normal_(0, 0.5)
    return model


def make_model(family="gpt2", seed=0, attn_implementation=None, **options):
    config_class, model_class, fields = FAMILIES[family]
    torch.manual_seed(seed)
    extra = {} if attn_implementation is None else dict(attn_implementation=attn_implementation)
    return sharpen(model_class(config_class(**fields(), **options, **extra))).eval()


def attention_modules(model):
    return [m for m in model.modules() if hasattr(m, "bet_attend")]


# ------------------------------------------------------------------------------- the attention vs the reference
def linear(weight, bias):
    return SimpleNamespace(weight=weight, bias=bias)


def gpt2_as_reference_module(attn, mode):
    """GPT-2's Conv1D projections (y = x W + b) as the reference's q/k/v/out_proj (y = x W^T + b)."""
    w, b = attn.c_attn.weight.T, attn.c_attn.bias
    q, k, v = (linear(w[i * DIM:(i + 1) * DIM], b[i * DIM:(i + 1) * DIM]) for i in range(3))
    return SimpleNamespace(q_proj=q, k_proj=k, v_proj=v, out_proj=linear(attn.c_proj.weight.T, attn.c_proj.bias),
                           num_heads=HEADS, bet_w=getattr(attn, "bet_w", None), variant_name=mode)


def llama_as_reference_module(attn, mode):
    """A grouped-query Llama attention as the multi-head one it equals: each key-value head's k and v rows
    repeated for the query heads that read it (query head h reads key-value head h // groups)."""
    groups = HEADS // KV_HEADS

    def repeated(proj):
        rows = proj.weight.view(KV_HEADS, 1, HEAD_DIM, DIM).expand(-1, groups, -1, -1).reshape(DIM, DIM)
        return linear(rows, None)

    return SimpleNamespace(q_proj=linear(attn.q_proj.weight, None), k_proj=repeated(attn.k_proj),
                           v_proj=repeated(attn.v_proj), out_proj=linear(attn.o_proj.weight, None),
                           num_heads=HEADS, bet_w=getattr(attn, "bet_w", None), variant_name=mode)


def options_of(config):
    return SimpleNamespace(bet_keep_diagonal=config.bet_keep_diagonal, diag_scale=config.diag_scale)


def run_attention(family, attn, x, mask):
    """The module on (B, T, E) ``x``; Llama with rotary embeddings that rotate by 0 (the reference has none:
    ``test_llama_rotary_embeddings_reach_queries_and_keys`` checks them)."""
    if family == "gpt2":
        return attn(x, attention_mask=mask)
    no_rotation = (torch.ones(B, x.size(1), HEAD_DIM), torch.zeros(B, x.size(1), HEAD_DIM))
    return attn(x, position_embeddings=no_rotation, attention_mask=mask)


CASES = [("gpt2", {}), ("gpt2", dict(bet_keep_diagonal=True)), ("gpt2", dict(bet_share_w=True)),
         ("llama", {}), ("llama", dict(bet_share_w=True, bet_keep_diagonal=True)),
         ("gpt2", dict(self_attn_mode="diag_free")), ("llama", dict(self_attn_mode="diag_scale", diag_scale=0.2))]


@pytest.mark.parametrize("family,options", CASES, ids=lambda v: v if isinstance(v, str) else
                         "-".join(f"{k}={v}" for k, v in v.items()) or "bet_sf")
@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_attention_equals_the_reference(family, options, attn_implementation):
    model = make_model(family, attn_implementation=attn_implementation, **options)
    attn = attention_modules(model)[0]
    adapter = (gpt2_as_reference_module if family == "gpt2" else llama_as_reference_module)(
        attn, model.config.self_attn_mode)
    x = torch.randn(B, T, DIM)
    pad = padding_mask(B, T, right=[(1, 2)])
    allowed = torch.ones(T, T, dtype=torch.bool).tril().view(1, 1, T, T) & ~pad.view(B, 1, 1, T)
    hf_mask = allowed if attn_implementation == "sdpa" else torch.zeros(allowed.shape).masked_fill(~allowed, -1e9)
    for mask, key_padding in ((None, None), (hf_mask, pad)):
        ref = reference_attention(adapter, x.transpose(0, 1), model.config.self_attn_mode, key_padding,
                                  options=options_of(model.config))
        with torch.no_grad():
            out, weights = run_attention(family, attn, x, mask)
        real = slice(None) if key_padding is None else ~key_padding
        torch.testing.assert_close(out.double()[real], ref.out.transpose(0, 1)[real], atol=1e-5, rtol=1e-5)
        if attn_implementation == "eager":  # eager returns A'
            real_rows = ~(torch.zeros(B, T, dtype=torch.bool) if key_padding is None else key_padding)
            torch.testing.assert_close(weights.double().transpose(1, 2)[real_rows],
                                       ref.probs.transpose(1, 2)[real_rows], atol=1e-6, rtol=1e-5)
        else:
            assert weights is None


def test_llama_rotary_embeddings_reach_queries_and_keys():
    """With w = 0 every R is 1/2, so BET(SF) without the DiagFreeMask is the stock attention at half the logits:
    the stock Llama attention with q_proj halved is an oracle of the rotary and grouped-query plumbing."""
    model = make_model("llama", bet_keep_diagonal=True)
    attn = attention_modules(model)[0]
    with torch.no_grad():
        attn.bet_w.zero_()
    stock = LlamaAttention(model.config, layer_idx=0).eval()
    stock.load_state_dict({k: v for k, v in attn.state_dict().items() if k != "bet_w"})
    with torch.no_grad():
        stock.q_proj.weight.mul_(0.5)
    x = torch.randn(B, T, DIM)
    rotary = model.model.rotary_emb(x, torch.arange(T).unsqueeze(0))
    causal = torch.ones(T, T, dtype=torch.bool).tril().view(1, 1, T, T)
    with torch.no_grad():
        expected, _ = stock(x, position_embeddings=rotary, attention_mask=causal)
        out, _ = attn(x, position_embeddings=rotary, attention_mask=causal)
        unrotated, _ = attn(x, position_embeddings=(torch.ones_like(rotary[0]), torch.zeros_like(rotary[1])),
                            attention_mask=causal)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(unrotated, expected, atol=0.05 * float(expected.abs().max()))


# ------------------------------------------------------------------------------- the cache
@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("options", [{}, dict(bet_keep_diagonal=True), dict(self_attn_mode="diag_free")],
                         ids=["bet_sf", "keepdiag", "diag_free"])
def test_cached_steps_equal_the_full_forward(family, options):
    model = make_model(family, **options)
    ids = torch.randint(0, VOCAB, (B, T))
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :3], use_cache=True)
        cache, steps = out.cache, [out.logits]
        for t in range(3, T):
            out = model(ids[:, t:t + 1], cache=cache, use_cache=True)
            cache = out.cache
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    values = cache.layers[0].values
    groups = HEADS // (KV_HEADS if family == "llama" else HEADS)
    extra = 2 * groups if model.config.self_attn_mode == "bet_sf" else 0
    assert values.shape[-1] == HEAD_DIM + extra  # [V | V w_h | R] per key-value head


def test_the_cached_r_is_read():
    """Corrupting the cached R changes the next step: the cache is used, not recomputed."""
    model = make_model("gpt2")
    ids = torch.randint(0, VOCAB, (B, T))
    with torch.no_grad():
        full = model(ids).logits
        cache = model(ids[:, :-1], use_cache=True).cache
        for layer in cache.layers:
            layer.values[..., HEAD_DIM + 1:] = 0.5  # R of every past key
        wrong = model(ids[:, -1:], cache=cache, use_cache=True).logits
    assert not torch.allclose(wrong, full[:, -1:], atol=1e-3)


def generation(model, prompt, **kwargs):
    pad = dict(pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        return [model.generate(prompt, max_new_tokens=8, do_sample=False, use_cache=use_cache, **pad, **kwargs)
                for use_cache in (True, False)]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_generate_with_the_cache_equals_without_greedy_and_beam_search(family, monkeypatch):
    model = make_model(family)
    prompt = torch.randint(1, VOCAB, (B, 4))
    cached, uncached = generation(model, prompt)
    assert torch.equal(cached, uncached)
    reorders = []
    original = DynamicCache.reorder_cache
    monkeypatch.setattr(DynamicCache, "reorder_cache",
                        lambda self, beam_idx: (reorders.append(beam_idx.clone()), original(self, beam_idx))[1])
    beams = dict(num_beams=4, num_return_sequences=2, output_scores=True, return_dict_in_generate=True)
    cached, uncached = generation(model, prompt, **beams)
    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(cached.sequences_scores, uncached.sequences_scores, atol=1e-5, rtol=1e-5)
    assert any(not torch.equal(idx, torch.arange(idx.numel())) for idx in reorders), "beams were never reordered"


def test_left_padded_batch_generates_as_each_prompt_alone():
    model = make_model("gpt2")
    short, long = torch.randint(1, VOCAB, (1, 3)), torch.randint(1, VOCAB, (1, 5))
    batch = torch.cat([torch.cat([torch.zeros(1, 2, dtype=torch.long), short], dim=1), long])
    mask = (torch.arange(5) >= torch.tensor([[2], [0]])).long()
    cached, uncached = generation(model, batch, attention_mask=mask)
    assert torch.equal(cached, uncached)
    alone, _ = generation(model, short)
    assert torch.equal(cached[0, 2:], alone[0])


# ------------------------------------------------------------------------------- saving, loading, converting
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_save_and_load_round_trip_keeps_the_variant_and_the_logits(family, tmp_path):
    model = make_model(family, bet_keep_diagonal=True, bet_share_w=True)
    ids = torch.randint(0, VOCAB, (B, T))
    model.save_pretrained(tmp_path)
    loaded, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert type(loaded) is type(model)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert loaded.config.bet_keep_diagonal and loaded.config.bet_share_w
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(ids).logits, model(ids).logits, atol=0, rtol=0)


@pytest.mark.parametrize("stock_class,config", [(GPT2LMHeadModel, GPT2Config(**gpt2_fields())),
                                                (LlamaForCausalLM, LlamaConfig(**llama_fields()))],
                         ids=["gpt2", "llama"])
def test_a_stock_model_becomes_bet_with_w_initialised_as_the_plugin(stock_class, config, tmp_path):
    torch.manual_seed(0)
    stock = stock_class(config).eval()
    stock.save_pretrained(tmp_path)
    bet_class = {GPT2LMHeadModel: BetGPT2LMHeadModel, LlamaForCausalLM: BetLlamaForCausalLM}[stock_class]
    loaded, info = bet_class.from_pretrained(tmp_path, output_loading_info=True)
    converted = to_bet(stock, bet_keep_diagonal=True)
    assert converted.config.bet_keep_diagonal and type(converted) is bet_class
    bound = 1.0 / (2 * HEAD_DIM) ** 0.5
    for bet in (loaded, converted):
        w = {name: p for name, p in bet.named_parameters() if name.endswith("bet_w")}
        assert len(w) == 2 and all(p.shape == (HEADS if bet is loaded else HEADS, 2 * HEAD_DIM) for p in w.values())
        assert all(float(p.detach().abs().max()) <= bound and float(p.detach().std()) > bound / 4 for p in w.values())
        stock_state = stock.state_dict()
        assert all(torch.equal(stock_state[name], p) for name, p in bet.state_dict().items() if name in stock_state)
    assert info["missing_keys"] == set(w) and not info["unexpected_keys"]


# ------------------------------------------------------------------------------- training
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_training_takes_the_fused_path_and_lowers_the_loss(family, monkeypatch):
    model = make_model(family).train()
    fused_calls = []
    original = incremental.bet_sf_fused
    monkeypatch.setattr(incremental, "bet_sf_fused", lambda *a, **k: (fused_calls.append(1), original(*a, **k))[1])
    ids = torch.randint(0, VOCAB, (4, 16))
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        out = model(ids, labels=ids)
        losses.append(out.loss.item())
        optimiser.zero_grad()
        out.loss.backward()
        optimiser.step()
    assert out.cache is None  # no cache filled in training
    assert len(fused_calls) == 8 * 2 and losses[-1] < losses[0] - 0.1, losses
    assert all(p.grad is not None and float(p.grad.abs().sum()) > 0 for n, p in model.named_parameters()
               if n.endswith("bet_w"))


# ------------------------------------------------------------------------------- what is refused
@pytest.mark.parametrize("family,options,message", [
    ("gpt2", dict(self_attn_mode="bet_sg"), "self_attn_mode='bet_sg'"),
    ("gpt2", dict(self_attn_mode="diag_scale"), "needs diag_scale > 0"),
    ("gpt2", dict(self_attn_mode="diag_free", bet_share_w=True), "apply to self_attn_mode='bet_sf'"),
    ("gpt2", dict(add_cross_attention=True), "add_cross_attention=True"),
    ("llama", dict(sliding_window=16), "sliding_window=16"),
    ("llama", dict(layer_types=["sliding_attention", "full_attention"]), "layer_types="),
])
def test_unsupported_options_are_refused_by_name(family, options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        make_model(family, **options)


def test_other_attention_implementations_and_caches_are_refused():
    model = make_model("gpt2")
    ids = torch.randint(0, VOCAB, (1, 4))
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation='flash_attention_2'"):
        model(ids)
    model.config._attn_implementation = "sdpa"
    from transformers import StaticCache
    with pytest.raises(ValueError, match="StaticLayer"), torch.no_grad():
        cache = StaticCache(config=model.config, max_cache_len=16)
        model(ids, cache=cache, use_cache=True)
        model(ids[:, :1], cache=cache, use_cache=True)
