"""BET versions of transformers' causal LMs: GPT-2, and the families whose attention has Llama's shape (Llama, Qwen2,
Qwen3, Mistral, OLMo-2, Phi-3, Gemma): a config class that records the variant, an attention module that computes
the stock projections and then ``BetAttentionMixin.bet_attend``, and the model class that puts it in every layer.
``to_bet`` turns a live stock model into its BET version."""

import functools

import torch
from transformers import (GemmaConfig, GemmaForCausalLM, GenerationMixin, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                          LlamaForCausalLM, MistralConfig, MistralForCausalLM, Olmo2Config, Olmo2ForCausalLM,
                          Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)
from transformers.models.gemma import modeling_gemma
from transformers.models.gpt2.modeling_gpt2 import GPT2Attention
from transformers.models.llama import modeling_llama
from transformers.models.mistral import modeling_mistral
from transformers.models.olmo2 import modeling_olmo2
from transformers.models.phi3 import modeling_phi3
from transformers.models.qwen2 import modeling_qwen2
from transformers.models.qwen3 import modeling_qwen3

from ..core.functional import split_heads
from .attention import BetAttentionMixin, BetConfigFields, BetStaticCache

# Config fields of attention features that BET's two passes do not combine with: a value other than None / False
# is refused (a config takes unknown fields, and transformers' caches and masks act on these ones).
UNSUPPORTED_FEATURES = {
    "sliding_window": "sliding-window attention",
    "use_sliding_window": "sliding-window attention",
    "attention_chunk_size": "chunked attention",
    "attn_logit_softcapping": "attention logit soft-capping",
    "add_cross_attention": "cross-attention (BET changes a decoder-only model's causal self-attention)",
    "use_bidirectional_attention": "bidirectional attention (BET's R and DiagFreeMask are defined for causal "
                                   "self-attention)",
}


def refuse_unsupported_features(config):
    for name, what in UNSUPPORTED_FEATURES.items():
        value = getattr(config, name, None)
        if value not in (None, False):
            raise ValueError(f"{name}={value!r}: BET does not combine with {what}; set it to None/False")
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(kind != "full_attention" for kind in layer_types):
        raise ValueError(f"layer_types={sorted(set(layer_types))}: BET needs full causal attention in every layer "
                         "(no sliding or chunked layers)")


def train_without_cache(forward):
    """The stock forward, but ``use_cache`` defaults to False in training mode: BET fills a cache through its exact
    path (R and V w_h for later steps), and training should take the fused one; pass ``use_cache=True`` to get a
    cache anyway."""
    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        if self.training and kwargs.get("use_cache") is None:
            kwargs["use_cache"] = False
        return forward(self, *args, **kwargs)
    return wrapper


class BetModelMixin:
    """A family's causal-LM class with a BET attention module (``bet_attention_class``) in each layer (the modules
    that ``attention_slots`` yields as (parent, attribute name))."""

    _supports_flash_attn = False
    _supports_flex_attn = False
    _supports_attention_backend = False
    _supports_sdpa = True
    _can_compile_fullgraph = True  # no data-dependent branch while traced (core.masks.tracing); static cache
    bet_attention_class = None

    def __init__(self, config):
        refuse_unsupported_features(config)
        super().__init__(config)
        for parent, name in self.attention_slots():
            setattr(parent, name, self.bet_attention_class(config, getattr(parent, name).layer_idx))
        if self.loss_type is None:  # GPT2LMHeadModel: transformers' name match misses it and warns in the forward,
            self.loss_type = "ForCausalLM"  # which a first call under torch.compile(fullgraph=True) cannot trace
        self.post_init()  # initialises only the new modules: the stock ones are marked initialised

    def initialize_weights(self):
        """The stock initialisation, then ``w`` of every BET layer that was not loaded (``from_pretrained`` of a stock
        checkpoint calls this for its missing keys). Not in ``_init_weights``: transformers hands the layers to the
        inner model's (``GPT2Model``, ``LlamaModel``) ``_init_weights``, not this class's."""
        super().initialize_weights()
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, BetAttentionMixin):
                    module.reset_bet_parameters()

    def _prepare_static_cache(self, *args, **kwargs):
        """generate's static cache (``cache_implementation="static"``) as a ``BetStaticCache``: the same size, with
        BET's value columns preallocated (transformers' own is built from the stock head size)."""
        stock = super()._prepare_static_cache(*args, **kwargs)
        cache = BetStaticCache(self.config.get_text_config(decoder=True), stock.layers[0].max_cache_len,
                               offloading=stock.offloading)
        first = stock.layers[0]
        if first.is_initialized:  # chunked prefill initialises it ahead of time: so does this one
            cache.early_initialization(first.batch_size, first.num_heads, first.k_head_dim, first.keys.dtype,
                                       first.device)
        return cache


# ------------------------------------------------------------------------------------ GPT-2
class BetGPT2Config(GPT2Config, BetConfigFields):
    model_type = "bet_gpt2"


class BetGPT2Attention(BetAttentionMixin, GPT2Attention):
    """GPT-2's causal self-attention (``c_attn``, ``c_proj``, dropouts as the stock module) with BET."""

    def __init__(self, config, layer_idx=None):
        super().__init__(config, is_cross_attention=False, layer_idx=layer_idx)
        self.init_bet(config, self.num_heads, self.num_heads, self.head_dim)

    def forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):
        q, k, v = (split_heads(x, self.num_heads) for x in self.c_attn(hidden_states).split(self.split_size, dim=2))
        out, weights = self.bet_attend(q, k, v, attention_mask, cache, self.attn_dropout.p if self.training else 0.0)
        return self.resid_dropout(self.c_proj(out)), weights


class BetGPT2LMHeadModel(BetModelMixin, GPT2LMHeadModel, GenerationMixin):
    config_class = BetGPT2Config
    bet_attention_class = BetGPT2Attention
    forward = train_without_cache(GPT2LMHeadModel.forward)

    def attention_slots(self):
        return [(block, "attn") for block in self.transformer.h]


# ------------------------------------------------------------------------------------ Llama-shaped families
class BetLlamaShapedAttention(BetAttentionMixin):
    """BET for the attention modules of transformers' Llama-shaped families (q, k, v, o projections, rotary
    embeddings, grouped-query heads, the same mask and cache interfaces). A family's class mixes this in before its
    stock module and names its ``apply_rotary_pos_emb`` (``rotary``); ``project`` gives q, k, v as the stock forward
    does before its rotary embeddings (families with q/k norms or a fused projection override it)."""

    rotary = staticmethod(modeling_llama.apply_rotary_pos_emb)

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        heads = config.num_attention_heads
        self.init_bet(config, heads, heads // self.num_key_value_groups, self.head_dim)

    def heads_first(self, x):
        """(B, T, n * d) -> (B, n, T, d)."""
        return x.view(*x.shape[:-1], -1, self.head_dim).transpose(1, 2)

    def project(self, hidden_states):
        return tuple(self.heads_first(proj(hidden_states)) for proj in (self.q_proj, self.k_proj, self.v_proj))

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
        q, k, v = self.project(hidden_states)
        q, k = self.rotary(q, k, *position_embeddings)
        out, weights = self.bet_attend(q, k, v, attention_mask, cache, self.attention_dropout if self.training else 0.0)
        return self.o_proj(out), weights


class BetLlamaConfig(LlamaConfig, BetConfigFields):
    model_type = "bet_llama"


class BetLlamaAttention(BetLlamaShapedAttention, modeling_llama.LlamaAttention):
    """Llama's self-attention (q, k, v, o projections, rotary embeddings, grouped-query heads) with BET."""


class BetLlamaShapedModel(BetModelMixin):
    """A Llama-shaped family's causal LM: its attention modules are ``model.layers[i].self_attn``."""

    def attention_slots(self):
        return [(layer, "self_attn") for layer in self.model.layers]


class BetLlamaForCausalLM(BetLlamaShapedModel, LlamaForCausalLM, GenerationMixin):
    config_class = BetLlamaConfig
    bet_attention_class = BetLlamaAttention
    forward = train_without_cache(LlamaForCausalLM.forward)


class BetQwen2Config(Qwen2Config, BetConfigFields):
    model_type = "bet_qwen2"


class BetQwen2Attention(BetLlamaShapedAttention, modeling_qwen2.Qwen2Attention):
    """Qwen2's self-attention (biased q, k, v projections) with BET; its sliding window stays off."""

    rotary = staticmethod(modeling_qwen2.apply_rotary_pos_emb)


class BetQwen2ForCausalLM(BetLlamaShapedModel, Qwen2ForCausalLM, GenerationMixin):
    config_class = BetQwen2Config
    bet_attention_class = BetQwen2Attention
    forward = train_without_cache(Qwen2ForCausalLM.forward)


class BetQwen3Config(Qwen3Config, BetConfigFields):
    model_type = "bet_qwen3"


class BetQwen3Attention(BetLlamaShapedAttention, modeling_qwen3.Qwen3Attention):
    """Qwen3's self-attention with BET: q and k normalised per head (RMSNorm over head_dim) before the rotary
    embeddings, so BET's R reads the normalised keys."""

    rotary = staticmethod(modeling_qwen3.apply_rotary_pos_emb)

    def project(self, hidden_states):
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        return (self.q_norm(self.q_proj(hidden_states).view(shape)).transpose(1, 2),
                self.k_norm(self.k_proj(hidden_states).view(shape)).transpose(1, 2),
                self.heads_first(self.v_proj(hidden_states)))


class BetQwen3ForCausalLM(BetLlamaShapedModel, Qwen3ForCausalLM, GenerationMixin):
    config_class = BetQwen3Config
    bet_attention_class = BetQwen3Attention
    forward = train_without_cache(Qwen3ForCausalLM.forward)


class BetMistralConfig(MistralConfig, BetConfigFields):
    model_type = "bet_mistral"


class BetMistralAttention(BetLlamaShapedAttention, modeling_mistral.MistralAttention):
    """Mistral's self-attention with BET (``sliding_window=None``: BET needs full causal attention)."""

    rotary = staticmethod(modeling_mistral.apply_rotary_pos_emb)


class BetMistralForCausalLM(BetLlamaShapedModel, MistralForCausalLM, GenerationMixin):
    config_class = BetMistralConfig
    bet_attention_class = BetMistralAttention
    forward = train_without_cache(MistralForCausalLM.forward)


class BetOlmo2Config(Olmo2Config, BetConfigFields):
    model_type = "bet_olmo2"


class BetOlmo2Attention(BetLlamaShapedAttention, modeling_olmo2.Olmo2Attention):
    """OLMo-2's self-attention with BET: q and k normalised over the whole projection (all heads together), before
    the split into heads."""

    rotary = staticmethod(modeling_olmo2.apply_rotary_pos_emb)

    def project(self, hidden_states):
        return (self.heads_first(self.q_norm(self.q_proj(hidden_states))),
                self.heads_first(self.k_norm(self.k_proj(hidden_states))),
                self.heads_first(self.v_proj(hidden_states)))


class BetOlmo2ForCausalLM(BetLlamaShapedModel, Olmo2ForCausalLM, GenerationMixin):
    config_class = BetOlmo2Config
    bet_attention_class = BetOlmo2Attention
    forward = train_without_cache(Olmo2ForCausalLM.forward)


class BetPhi3Config(Phi3Config, BetConfigFields):
    model_type = "bet_phi3"


class BetPhi3Attention(BetLlamaShapedAttention, modeling_phi3.Phi3Attention):
    """Phi-3's self-attention with BET: one fused projection, rows q | k | v; rotary embeddings on a part of each
    head (``partial_rotary_factor``, in Phi-3's own ``apply_rotary_pos_emb``)."""

    rotary = staticmethod(modeling_phi3.apply_rotary_pos_emb)

    def project(self, hidden_states):
        q_width = self.config.num_attention_heads * self.head_dim
        kv_width = self.num_key_value_heads * self.head_dim
        q, k, v = self.qkv_proj(hidden_states).split([q_width, kv_width, kv_width], dim=-1)
        return self.heads_first(q), self.heads_first(k), self.heads_first(v)


class BetPhi3ForCausalLM(BetLlamaShapedModel, Phi3ForCausalLM, GenerationMixin):
    config_class = BetPhi3Config
    bet_attention_class = BetPhi3Attention
    forward = train_without_cache(Phi3ForCausalLM.forward)


class BetGemmaConfig(GemmaConfig, BetConfigFields):
    model_type = "bet_gemma"


class BetGemmaAttention(BetLlamaShapedAttention, modeling_gemma.GemmaAttention):
    """Gemma's self-attention with BET (its own head_dim and scaling; causal only)."""

    rotary = staticmethod(modeling_gemma.apply_rotary_pos_emb)


class BetGemmaForCausalLM(BetLlamaShapedModel, GemmaForCausalLM, GenerationMixin):
    config_class = BetGemmaConfig
    bet_attention_class = BetGemmaAttention
    forward = train_without_cache(GemmaForCausalLM.forward)


BET_CLASSES = {GPT2LMHeadModel: BetGPT2LMHeadModel, LlamaForCausalLM: BetLlamaForCausalLM,
               Qwen2ForCausalLM: BetQwen2ForCausalLM, Qwen3ForCausalLM: BetQwen3ForCausalLM,
               MistralForCausalLM: BetMistralForCausalLM, Olmo2ForCausalLM: BetOlmo2ForCausalLM,
               Phi3ForCausalLM: BetPhi3ForCausalLM, GemmaForCausalLM: BetGemmaForCausalLM}
CONFIG_KEYS_NOT_COPIED = ("model_type", "architectures", "transformers_version")


def to_bet(model, **options):
    """A BET version of a stock causal LM of a family in ``BET_CLASSES`` with its weights (copied) and new ``w``;
    ``options``: ``BetConfigFields`` (``bet_keep_diagonal=True`` ...). Same device, dtype and training mode."""
    bet_class = BET_CLASSES.get(type(model))
    if bet_class is None:
        raise TypeError(f"to_bet: {type(model).__name__} is not supported; supported: "
                        f"{', '.join(cls.__name__ for cls in BET_CLASSES)}")
    fields = {key: value for key, value in model.config.to_dict().items() if key not in CONFIG_KEYS_NOT_COPIED}
    config = bet_class.config_class(**{**fields, **options}, attn_implementation=model.config._attn_implementation)
    parameter = next(model.parameters())
    bet = bet_class(config).to(device=parameter.device, dtype=parameter.dtype)
    missing, unexpected = bet.load_state_dict(model.state_dict(), strict=False)
    new = {name for name, _ in bet.named_parameters() if name.endswith(".bet_w")}
    if unexpected or set(missing) - new:
        raise RuntimeError(f"to_bet: weights did not map: missing {sorted(set(missing) - new)}, "
                           f"unexpected {sorted(unexpected)}")
    return bet.train(model.training)


__all__ = ["BET_CLASSES", "to_bet", "BetModelMixin", "BetLlamaShapedAttention", "BetLlamaShapedModel",
           *(name for cls in BET_CLASSES.values()
             for name in (cls.__name__, cls.config_class.__name__, cls.bet_attention_class.__name__))]
