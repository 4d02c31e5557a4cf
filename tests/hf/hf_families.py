"""The model families of bet_fairseq.hf on small random configs, shared by the tests in tests/hf: how to build each,
its stock class, and its queries, keys and values computed here in float64 from the module's weights (the
projections, Qwen3's per-head and OLMo-2's whole-projection q/k RMSNorms, Phi-3's fused projection), so that the
attention can be checked against tests/reference.py's float64 oracle."""

from types import SimpleNamespace

import torch
from transformers import (GemmaForCausalLM, GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, Olmo2ForCausalLM,
                          Phi3ForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)

from bet_fairseq.hf import BET_CLASSES

VOCAB, DIM, HEADS, KV_HEADS, T, B = 50, 32, 4, 2, 7, 2
HEAD_DIM = DIM // HEADS
STOCK = {"gpt2": GPT2LMHeadModel, "llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM, "qwen3": Qwen3ForCausalLM,
         "mistral": MistralForCausalLM, "olmo2": Olmo2ForCausalLM, "phi3": Phi3ForCausalLM, "gemma": GemmaForCausalLM}
FAMILIES = list(STOCK)
LLAMA_SHAPED = FAMILIES[1:]


def fields(family: str) -> dict:
    """A 2-layer config of ``family``, grouped-query heads for the Llama-shaped ones. initializer_range 0.2 (not
    0.02): attention logits of order 1, so that R, the diagonal and positions move the outputs."""
    if family == "gpt2":
        return dict(n_layer=2, n_embd=DIM, n_head=HEADS, vocab_size=VOCAB, n_positions=64, resid_pdrop=0.0,
                    embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.2)
    extra = {"mistral": dict(sliding_window=None), "qwen2": dict(attention_bias=True),
             "phi3": dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)}.get(family, {})
    return dict(num_hidden_layers=2, hidden_size=DIM, intermediate_size=2 * DIM, num_attention_heads=HEADS,
                num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, vocab_size=VOCAB, max_position_embeddings=64,
                initializer_range=0.2, **extra)


def bet_class(family: str):
    return BET_CLASSES[STOCK[family]]


def sharpen(model):
    """w far from its init so that R varies visibly (BET then changes the outputs a lot); q/k norm weights away from
    1 so that a norm read wrongly shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bet_w"):
                p.normal_(0, 0.5)
            elif name.endswith(("q_norm.weight", "k_norm.weight")):
                p.normal_(1, 0.3)
    return model


def make_model(family="gpt2", seed=0, attn_implementation=None, **options):
    model_class = bet_class(family)
    torch.manual_seed(seed)
    extra = {} if attn_implementation is None else dict(attn_implementation=attn_implementation)
    return sharpen(model_class(model_class.config_class(**{**fields(family), **options}, **extra))).eval()


def one_layer(family: str) -> dict:
    """The option that makes ``make_model`` build one layer (tracing costs grow with the layers)."""
    return dict(n_layer=1) if family == "gpt2" else dict(num_hidden_layers=1)


def attention_modules(model):
    return [m for m in model.modules() if hasattr(m, "bet_attend")]


def rms_norm(x, weight, eps):
    """RMSNorm over the last dimension, in float64."""
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.detach().double()


def projected(x, weight, bias=None):
    y = x.double() @ weight.detach().double().T
    return y if bias is None else y + bias.detach().double()


def reference_qkv(family, attn, x):
    """The (T, B, H d) queries, keys and values of Llama-shaped ``attn`` on (B, T, E) ``x``, unscaled, without rotary
    embeddings (the attention tests rotate by 0), each key-value head repeated for the query heads that read it
    (query head h reads key-value head h // groups): the multi-head attention a grouped-query one equals."""
    eps = getattr(attn.config, "rms_norm_eps", None)
    if family == "phi3":
        w = attn.qkv_proj.weight
        q, k, v = (projected(x, part) for part in w.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM,
                                                           KV_HEADS * HEAD_DIM]))
    else:
        q, k, v = (projected(x, p.weight, p.bias) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    if family == "olmo2":  # over the whole projection
        q, k = rms_norm(q, attn.q_norm.weight, eps), rms_norm(k, attn.k_norm.weight, eps)
    elif family == "qwen3":  # per head
        q = rms_norm(q.unflatten(-1, (HEADS, HEAD_DIM)), attn.q_norm.weight, eps).flatten(-2)
        k = rms_norm(k.unflatten(-1, (KV_HEADS, HEAD_DIM)), attn.k_norm.weight, eps).flatten(-2)
    groups = HEADS // KV_HEADS
    k, v = (t.unflatten(-1, (KV_HEADS, 1, HEAD_DIM)).expand(-1, -1, -1, groups, -1).flatten(-3) for t in (k, v))
    return tuple(t.transpose(0, 1) for t in (q, k, v))


def linear(weight, bias):
    return SimpleNamespace(weight=weight, bias=bias)


def gpt2_as_reference_module(attn, mode):
    """GPT-2's Conv1D projections (y = x W + b) as the reference's q/k/v/out_proj (y = x W^T + b)."""
    w, b = attn.c_attn.weight.T, attn.c_attn.bias
    q, k, v = (linear(w[i * DIM:(i + 1) * DIM], b[i * DIM:(i + 1) * DIM]) for i in range(3))
    return SimpleNamespace(q_proj=q, k_proj=k, v_proj=v, out_proj=linear(attn.c_proj.weight.T, attn.c_proj.bias),
                           num_heads=HEADS, bet_w=getattr(attn, "bet_w", None), variant_name=mode)


def llama_shaped_as_reference_module(attn, mode):
    """The output projection, heads and w of a Llama-shaped attention (its q, k, v come from ``reference_qkv``)."""
    return SimpleNamespace(out_proj=linear(attn.o_proj.weight, attn.o_proj.bias), num_heads=HEADS,
                           bet_w=getattr(attn, "bet_w", None), variant_name=mode)


def no_rotation(length: int):
    """Rotary embeddings (cos, sin) that rotate by 0."""
    return torch.ones(B, length, HEAD_DIM), torch.zeros(B, length, HEAD_DIM)


def run_attention(family, attn, x, mask):
    """The module on (B, T, E) ``x``; Llama-shaped ones with rotary embeddings that rotate by 0 (the reference has
    none: ``test_rotary_embeddings_reach_queries_and_keys`` checks them)."""
    if family == "gpt2":
        return attn(x, attention_mask=mask)
    return attn(x, position_embeddings=no_rotation(x.size(1)), attention_mask=mask)
