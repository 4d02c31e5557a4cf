"""bet_fairseq.hf on small random configs of every family (GPT-2; Llama, Qwen2, Qwen3, Mistral, OLMo-2, Phi-3 and
Gemma with grouped-query heads): the attention against tests/reference.py's float64 math, cached steps and generate()
(dynamic and static caches) against the full forward, save/load, training, and the refusals."""

from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, DynamicCache, GenerationMixin, StaticCache  # noqa: E402
from transformers.cache_utils import Cache, StaticSlidingWindowLayer  # noqa: E402

import bet_fairseq.core.incremental as incremental  # noqa: E402
from bet_fairseq.hf import BetStaticCache, to_bet  # noqa: E402
from conftest import padding_mask  # noqa: E402
from hf_families import (B, DIM, FAMILIES, HEAD_DIM, HEADS, KV_HEADS, LLAMA_SHAPED, STOCK, T, VOCAB,  # noqa: E402
                         attention_modules, bet_class, fields, gpt2_as_reference_module,
                         llama_shaped_as_reference_module, make_model, reference_qkv, run_attention)
from reference import reference_attention  # noqa: E402


# ------------------------------------------------------------------------------- the attention vs the reference
def options_of(config):
    return SimpleNamespace(bet_keep_diagonal=config.bet_keep_diagonal, diag_scale=config.diag_scale)


CASES = [("gpt2", {}), ("gpt2", dict(bet_keep_diagonal=True)), ("gpt2", dict(bet_share_w=True)),
         ("llama", {}), ("llama", dict(bet_share_w=True, bet_keep_diagonal=True)),
         ("gpt2", dict(self_attn_mode="diag_free")), ("llama", dict(self_attn_mode="diag_scale", diag_scale=0.2)),
         *((family, {}) for family in LLAMA_SHAPED[1:]), ("qwen3", dict(self_attn_mode="diag_free"))]


@pytest.mark.parametrize("family,options", CASES, ids=lambda v: v if isinstance(v, str) else
                         "-".join(f"{k}={v}" for k, v in v.items()) or "bet_sf")
@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_attention_equals_the_reference(family, options, attn_implementation):
    model = make_model(family, attn_implementation=attn_implementation, **options)
    attn = attention_modules(model)[0]
    mode = model.config.self_attn_mode
    x = torch.randn(B, T, DIM)
    if family == "gpt2":
        adapter, qkv = gpt2_as_reference_module(attn, mode), None
    else:
        adapter, qkv = llama_shaped_as_reference_module(attn, mode), reference_qkv(family, attn, x)
    pad = padding_mask(B, T, right=[(1, 2)])
    allowed = torch.ones(T, T, dtype=torch.bool).tril().view(1, 1, T, T) & ~pad.view(B, 1, 1, T)
    hf_mask = allowed if attn_implementation == "sdpa" else torch.zeros(allowed.shape).masked_fill(~allowed, -1e9)
    for mask, key_padding in ((None, None), (hf_mask, pad)):
        ref = reference_attention(adapter, x.transpose(0, 1), mode, key_padding, options=options_of(model.config),
                                  qkv=qkv)
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


@pytest.mark.parametrize("family", LLAMA_SHAPED)
def test_rotary_embeddings_reach_queries_and_keys(family):
    """With w = 0 every R is 1/2, so BET(SF) without the DiagFreeMask is the stock attention at half the logits:
    the family's stock attention with its scaling halved is an oracle of the rotary, q/k norm, fused-projection
    and grouped-query plumbing."""
    model = make_model(family, bet_keep_diagonal=True)
    attn = attention_modules(model)[0]
    with torch.no_grad():
        attn.bet_w.zero_()
    stock_class = next(c for c in type(attn).__mro__ if c.__module__.startswith("transformers.models."))
    stock = stock_class(model.config, layer_idx=0).eval()
    stock.load_state_dict({k: v for k, v in attn.state_dict().items() if k != "bet_w"})
    stock.scaling = attn.scaling / 2
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
CACHE_CASES = [("gpt2", {}), ("gpt2", dict(bet_keep_diagonal=True)), ("llama", dict(self_attn_mode="diag_free")),
               *((family, {}) for family in LLAMA_SHAPED)]
CACHE_IDS = [f"{family}-{'-'.join(f'{k}={v}' for k, v in options.items()) or 'bet_sf'}"
             for family, options in CACHE_CASES]


def value_width(model):
    """[V | V w_h | R] per key-value head: head_dim + 2 * (query heads per key-value head) for BET(SF)."""
    groups = HEADS // getattr(model.config, "num_key_value_heads", HEADS)
    return HEAD_DIM + (2 * groups if model.config.self_attn_mode == "bet_sf" else 0)


@pytest.mark.parametrize("family,options", CACHE_CASES, ids=CACHE_IDS)
@pytest.mark.parametrize("cache_kind", ["dynamic", "static"])
def test_cached_steps_equal_the_full_forward(family, options, cache_kind):
    model = make_model(family, **options)
    ids = torch.randint(0, VOCAB, (B, T))
    with torch.no_grad():
        full = model(ids).logits
        cache = BetStaticCache(model.config, max_cache_len=12) if cache_kind == "static" else None
        out = model(ids[:, :3], cache=cache, use_cache=True)
        cache, steps = out.cache, [out.logits]
        for t in range(3, T):
            out = model(ids[:, t:t + 1], cache=cache, use_cache=True)
            cache = out.cache
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.layers[0].values.shape[-1] == value_width(model)
    assert cache.layers[0].values.shape[-2] == (12 if cache_kind == "static" else T)


@pytest.mark.parametrize("cache_kind", ["dynamic", "static"])
def test_the_cached_r_is_read(cache_kind):
    """Corrupting the cached R changes the next step: the cache is used, not recomputed."""
    model = make_model("gpt2")
    ids = torch.randint(0, VOCAB, (B, T))
    with torch.no_grad():
        full = model(ids).logits
        cache = BetStaticCache(model.config, max_cache_len=T) if cache_kind == "static" else None
        cache = model(ids[:, :-1], cache=cache, use_cache=True).cache
        for layer in cache.layers:
            layer.values[..., HEAD_DIM + 1:] = 0.5  # R of every past key
        wrong = model(ids[:, -1:], cache=cache, use_cache=True).logits
    assert not torch.allclose(wrong, full[:, -1:], atol=1e-3)


def test_a_static_cache_initialised_ahead_of_time_has_bet_columns():
    """``early_initialization`` (torch.export recipes, chunked prefill) passes the stock head size; a BetStaticCache
    still holds [V | V w_h | R], and a stock StaticCache initialised so is refused by name."""
    model = make_model("llama")
    ids = torch.randint(0, VOCAB, (B, 4))
    bet_cache = BetStaticCache(model.config, max_cache_len=8)
    stock_cache = StaticCache(config=model.config, max_cache_len=8)
    for cache in (bet_cache, stock_cache):
        cache.early_initialization(B, KV_HEADS, HEAD_DIM, torch.float32, torch.device("cpu"))
    assert bet_cache.layers[0].values.shape == (B, KV_HEADS, 8, value_width(model))
    with torch.no_grad():
        torch.testing.assert_close(model(ids, cache=bet_cache, use_cache=True).logits, model(ids).logits,
                                   atol=1e-5, rtol=1e-5)
        with pytest.raises(ValueError, match="build it as BetStaticCache"):
            model(ids, cache=stock_cache, use_cache=True)


def generation(model, prompt, kinds=(True, False), **kwargs):
    """generate() for each of ``kinds``: True / False (use_cache, the dynamic cache or none) or a cache_implementation
    name."""
    pad = dict(pad_token_id=0, eos_token_id=None)
    runs = []
    with torch.no_grad():
        for kind in kinds:
            choice = dict(use_cache=kind) if isinstance(kind, bool) else dict(cache_implementation=kind)
            runs.append(model.generate(prompt, max_new_tokens=8, do_sample=False, **choice, **pad, **kwargs))
    return runs


BEAMS = dict(num_beams=4, num_return_sequences=2, output_scores=True, return_dict_in_generate=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_with_the_cache_equals_without_greedy_and_beam_search(family, monkeypatch):
    model = make_model(family)
    prompt = torch.randint(1, VOCAB, (B, 4))
    cached, uncached = generation(model, prompt)
    assert torch.equal(cached, uncached)
    reorders = []
    original = DynamicCache.reorder_cache
    monkeypatch.setattr(DynamicCache, "reorder_cache",
                        lambda self, beam_idx: (reorders.append(beam_idx.clone()), original(self, beam_idx))[1])
    cached, uncached = generation(model, prompt, **BEAMS)
    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(cached.sequences_scores, uncached.sequences_scores, atol=1e-5, rtol=1e-5)
    assert any(not torch.equal(idx, torch.arange(idx.numel())) for idx in reorders), "beams were never reordered"


@pytest.mark.parametrize("family,options", [*((family, {}) for family in FAMILIES),
                                            ("gpt2", dict(self_attn_mode="diag_free")),
                                            ("llama", dict(self_attn_mode="diag_scale", diag_scale=2.0)),
                                            ("qwen3", dict(bet_keep_diagonal=True))],
                         ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}={v}" for k, v in v.items()))
def test_the_static_cache_generates_the_dynamic_caches_tokens_and_scores(family, options):
    model = make_model(family, **options)
    prompt = torch.randint(1, VOCAB, (B, 4))
    scores = dict(output_scores=True, return_dict_in_generate=True)
    for extra in (scores, BEAMS):
        dynamic, static = generation(model, prompt, kinds=("dynamic", "static"), **extra)
        assert torch.equal(dynamic.sequences, static.sequences)
        for a, b in zip(dynamic.scores, static.scores):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert isinstance(generation(model, prompt, kinds=("static",), return_dict_in_generate=True)[0].cache,
                      BetStaticCache)


def test_left_padded_batch_generates_as_each_prompt_alone():
    model = make_model("gpt2")
    short, long = torch.randint(1, VOCAB, (1, 3)), torch.randint(1, VOCAB, (1, 5))
    batch = torch.cat([torch.cat([torch.zeros(1, 2, dtype=torch.long), short], dim=1), long])
    mask = (torch.arange(5) >= torch.tensor([[2], [0]])).long()
    cached, uncached, static = generation(model, batch, kinds=(True, False, "static"), attention_mask=mask)
    assert torch.equal(cached, uncached) and torch.equal(cached, static)
    alone, _ = generation(model, short)
    assert torch.equal(cached[0, 2:], alone[0])


# ------------------------------------------------------------------------------- saving, loading, converting
@pytest.mark.parametrize("family", FAMILIES)
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


@pytest.mark.parametrize("family", FAMILIES)
def test_a_stock_model_becomes_bet_with_w_initialised_as_the_plugin(family, tmp_path):
    stock_class = STOCK[family]
    torch.manual_seed(0)
    stock = stock_class(stock_class.config_class(**fields(family))).eval()
    stock.save_pretrained(tmp_path)
    loaded, info = bet_class(family).from_pretrained(tmp_path, output_loading_info=True)
    converted = to_bet(stock, bet_keep_diagonal=True)
    assert converted.config.bet_keep_diagonal and type(converted) is bet_class(family)
    bound = 1.0 / (2 * HEAD_DIM) ** 0.5
    stock_state = stock.state_dict()
    for bet in (loaded, converted):
        w = {name: p for name, p in bet.named_parameters() if name.endswith("bet_w")}
        assert len(w) == 2 and all(p.shape == (HEADS, 2 * HEAD_DIM) for p in w.values())
        assert all(float(p.detach().abs().max()) <= bound and float(p.detach().std()) > bound / 4 for p in w.values())
        assert all(torch.equal(stock_state[name], p) for name, p in bet.state_dict().items() if name in stock_state)
        assert set(bet.state_dict()) - set(w) == set(stock_state)
    assert info["missing_keys"] == set(w) and not info["unexpected_keys"]


# ------------------------------------------------------------------------------- training
@pytest.mark.parametrize("family", FAMILIES)
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


# ------------------------------------------------------------------------------- transformers' conventions
@pytest.mark.parametrize("family", FAMILIES)
def test_the_classes_follow_transformers_conventions(family):
    """GenerationMixin a direct parent (transformers' test helpers check ``__bases__``), fullgraph compilation
    declared, and the Auto classes resolve the BET config to the BET class."""
    model_class = bet_class(family)
    assert GenerationMixin in model_class.__bases__
    assert model_class._can_compile_fullgraph
    config = model_class.config_class(**fields(family))
    assert type(AutoModelForCausalLM.from_config(config)) is model_class


# ------------------------------------------------------------------------------- what is refused
@pytest.mark.parametrize("family,options,message", [
    ("gpt2", dict(self_attn_mode="bet_sg"), "self_attn_mode='bet_sg'"),
    ("gpt2", dict(self_attn_mode="diag_scale"), "needs diag_scale > 0"),
    ("gpt2", dict(self_attn_mode="diag_free", bet_share_w=True), "apply to self_attn_mode='bet_sf'"),
    ("gpt2", dict(add_cross_attention=True), "add_cross_attention=True"),
    ("llama", dict(sliding_window=16), "sliding_window=16"),
    ("llama", dict(layer_types=["sliding_attention", "full_attention"]), "layer_types="),
    ("mistral", dict(sliding_window=4096), "sliding_window=4096"),
    ("qwen2", dict(use_sliding_window=True, sliding_window=16), "sliding"),
    ("gemma", dict(use_bidirectional_attention=True), "use_bidirectional_attention=True"),
    ("gemma", dict(attn_logit_softcapping=50.0), "attn_logit_softcapping=50.0"),
])
def test_unsupported_options_are_refused_by_name(family, options, message):
    model_class = bet_class(family)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        model_class(model_class.config_class(**{**fields(family), **options}))


def test_a_stock_mistral_with_its_sliding_window_is_refused_by_to_bet():
    stock = STOCK["mistral"](STOCK["mistral"].config_class(**{**fields("mistral"), "sliding_window": 4096}))
    with pytest.raises(ValueError, match="sliding_window=4096: BET does not combine with sliding-window attention"):
        to_bet(stock)


def test_other_attention_implementations_and_caches_are_refused():
    model = make_model("gpt2")
    ids = torch.randint(0, VOCAB, (1, 4))
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation='flash_attention_2'"):
        model(ids)
    model.config._attn_implementation = "sdpa"
    sliding = Cache(layers=[StaticSlidingWindowLayer(max_cache_len=16, sliding_window=4) for _ in range(2)])
    with pytest.raises(ValueError, match="StaticSlidingWindowLayer"), torch.no_grad():
        model(ids, cache=sliding, use_cache=True)
    with pytest.raises(ValueError, match="BET needs full causal attention"):
        BetStaticCache(STOCK["mistral"].config_class(**{**fields("mistral"), "sliding_window": 4}), max_cache_len=8)
    with pytest.raises(ValueError, match="Fp8QuantizedLayer"), torch.no_grad():
        model.generate(ids, max_new_tokens=2, cache_implementation="quantized", pad_token_id=0,
                       cache_config={"backend": "fp8"})
