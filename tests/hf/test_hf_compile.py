"""BET under torch.compile and torch.export on small random configs of every family: the traced graphs hold no branch
on a tensor's values and no memory-address memo (``core.masks.tracing``), so that ``torch.compile(model,
fullgraph=True)`` trains with the eager loss and gradients, ``torch.export.export`` gives the eager logits in training
mode (the fused path) and for a decoding step over the static cache, and a compiled ``generate`` with the static cache
gives the eager tokens.

Inductor compiles C++ for every graph: on a loaded 2-core CPU that takes from under a minute to several minutes
per family (forward and backward), so the default run compiles with the ``aot_eager`` / ``eager`` backends (Dynamo's
full-graph capture and AOTAutograd's backward, the parts that refuse a data-dependent branch) for one family, and
exports every family; ``BET_TEST_COMPILE=1`` runs every family with Inductor as well."""

import os

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import CompileConfig  # noqa: E402

import bet_fairseq.core.incremental as incremental  # noqa: E402
from bet_fairseq.hf import BetStaticCache  # noqa: E402
from hf_families import FAMILIES, VOCAB, make_model, one_layer  # noqa: E402

ALL = os.environ.get("BET_TEST_COMPILE") == "1"
needs_inductor = pytest.mark.skipif(not ALL, reason="Inductor compiles for minutes on CPU: BET_TEST_COMPILE=1 runs it")


def training_loss_and_grads(model, ids, run=None):
    """The loss of ``run(ids)`` (default ``model``) and the gradients it leaves on ``model``'s parameters."""
    model.zero_grad(set_to_none=True)
    loss = (model if run is None else run)(ids, labels=ids).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def check_compiled_training(family, backend):
    model = make_model(family).train()
    ids = torch.randint(0, VOCAB, (2, 16))
    loss, grads = training_loss_and_grads(model, ids)
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    compiled_loss, compiled_grads = training_loss_and_grads(model, ids, compiled)
    torch.testing.assert_close(compiled_loss, loss, atol=1e-5, rtol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(compiled_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)
    assert any(n.endswith("bet_w") and float(g.abs().sum()) > 0 for n, g in compiled_grads.items())


def test_compiled_training_step_equals_eager_without_a_graph_break():
    check_compiled_training("llama", "aot_eager")


@needs_inductor
@pytest.mark.parametrize("family", FAMILIES)
def test_inductor_training_step_equals_eager(family):
    check_compiled_training(family, "inductor")


@pytest.mark.parametrize("family", FAMILIES)
def test_export_in_training_mode_takes_the_fused_path_and_gives_the_eager_logits(family, monkeypatch):
    model = make_model(family, **one_layer(family)).train()
    ids = torch.randint(0, VOCAB, (2, 9))
    eager = model(ids).logits.detach()
    fused_calls = []
    original = incremental.bet_sf_fused
    monkeypatch.setattr(incremental, "bet_sf_fused", lambda *a, **k: (fused_calls.append(1), original(*a, **k))[1])
    program = torch.export.export(model, (ids,))
    assert fused_calls, "export did not trace the fused path"
    torch.testing.assert_close(program.module()(ids).logits, eager, atol=1e-5, rtol=1e-5)


class DecodingStep(torch.nn.Module):
    """One decoding step of ``model`` over a ``BetStaticCache`` whose tensors are buffers, so that an exported
    program carries the cache and its in-place updates (as transformers' own export wrappers do)."""

    def __init__(self, model, cache):
        super().__init__()
        self.model, self.cache = model, cache
        for i, layer in enumerate(cache.layers):
            self.register_buffer(f"keys_{i}", layer.keys, persistent=False)
            self.register_buffer(f"values_{i}", layer.values, persistent=False)
            self.register_buffer(f"length_{i}", layer.cumulative_length, persistent=False)

    def forward(self, ids):
        return self.model(ids, cache=self.cache, use_cache=True).logits


@pytest.mark.parametrize("family", FAMILIES if ALL else ["gpt2", "qwen3"])
def test_an_exported_decoding_step_gives_the_eager_logits(family):
    """Two steps of the exported program after an eager prefill equal the full forward's last two positions: the
    program reads the prefilled R and V w_h, and writes its own for the next step. Exported with Dynamo
    (``strict=True``, as transformers' own static-cache export does): it follows the cache's tensors to the
    module's buffers, where the non-strict tracer would treat them as constants. (Every family with
    BET_TEST_COMPILE=1: each export takes seconds.)"""
    model = make_model(family, **one_layer(family))
    ids = torch.randint(0, VOCAB, (2, 6))
    with torch.no_grad():
        full = model(ids).logits
        cache = BetStaticCache(model.config, max_cache_len=8)
        model(ids[:, :4], cache=cache, use_cache=True)
        program = torch.export.export(DecodingStep(model, cache), (ids[:, 4:5],), strict=True)
        step = program.module()
        torch.testing.assert_close(step(ids[:, 4:5]), full[:, 4:5], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(step(ids[:, 5:6]), full[:, 5:6], atol=1e-5, rtol=1e-5)


def compiled_generation(model, backend, **kwargs):
    config = CompileConfig(fullgraph=True, backend=backend, mode="default")
    config._compile_all_devices = True  # transformers compiles generate() on accelerators only, unless told
    options = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None, output_scores=True,
                   return_dict_in_generate=True, **kwargs)
    prompt = torch.randint(1, VOCAB, (2, 4))
    with torch.no_grad():
        dynamic = model.generate(prompt, **options)
        compiled = model.generate(prompt, cache_implementation="static", compile_config=config, **options)
    assert torch.equal(compiled.sequences, dynamic.sequences)
    for a, b in zip(compiled.scores, dynamic.scores):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_compiled_generate_with_the_static_cache_gives_the_dynamic_caches_tokens():
    compiled_generation(make_model("qwen3", **one_layer("qwen3")), "eager")


@needs_inductor
@pytest.mark.parametrize("family", FAMILIES)
def test_inductor_generate_with_the_static_cache_gives_the_dynamic_caches_tokens(family):
    model = make_model(family)
    compiled_generation(model, "inductor")
    compiled_generation(model, "inductor", num_beams=3, num_return_sequences=2)


def test_while_tracing_the_masks_take_no_branch_on_data_and_no_memo(monkeypatch):
    """What the traced paths rely on, seen without a compiler: ``rows_without_keys`` hands back its tensor even when
    no row is empty (no ``bool()`` of data), and ``LastMaskMemo`` calls its function every time (no memory address
    read); outside tracing the memo still remembers, which keeps the eager CPU path's speed."""
    from bet_fairseq.core import masks

    calls = []
    memo = masks.LastMaskMemo(lambda mask: calls.append(1) or mask.sum())
    causal = masks.causal_allowed(4, 4)
    assert masks.rows_without_keys(causal) is None
    memo(causal), memo(causal)
    assert len(calls) == 1
    monkeypatch.setattr(masks, "tracing", lambda: True)
    empty = masks.rows_without_keys(causal)
    assert empty is not None and not bool(empty.any())
    memo(causal), memo(causal)
    assert len(calls) == 3
