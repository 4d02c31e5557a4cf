"""BET versions of transformers' GPT-2 and Llama causal LMs: a config class that records the variant, an attention
module that computes the stock projections and then ``BetAttentionMixin.bet_attend``, and the model class that
puts it in every layer. ``to_bet`` turns a live stock model into its BET version."""

import functools

import torch

from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
from transformers.models.gpt2.modeling_gpt2 import GPT2Attention
from transformers.models.llama.modeling_llama import LlamaAttention, apply_rotary_pos_emb

from ..core.functional import split_heads
from .attention import BetAttentionMixin, BetConfigFields

# Config fields of attention features that BET's two passes do not combine with: a value other than None / False
# is refused (a config takes unknown fields, and transformers' caches and masks act on these ones).
UNSUPPORTED_FEATURES = {
    "sliding_window": "sliding-window attention",
    "use_sliding_window": "sliding-window attention",
    "attention_chunk_size": "chunked attention",
    "attn_logit_softcapping": "attention logit soft-capping",
    "add_cross_attention": "cross-attention (BET changes a decoder-only model's causal self-attention)",
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
    _can_compile_fullgraph = False
    bet_attention_class = None

    def __init__(self, config):
        refuse_unsupported_features(config)
        super().__init__(config)
        for parent, name in self.attention_slots():
            setattr(parent, name, self.bet_attention_class(config, getattr(parent, name).layer_idx))
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


class BetGPT2LMHeadModel(BetModelMixin, GPT2LMHeadModel):
    config_class = BetGPT2Config
    bet_attention_class = BetGPT2Attention
    forward = train_without_cache(GPT2LMHeadModel.forward)

    def attention_slots(self):
        return [(block, "attn") for block in self.transformer.h]


# ------------------------------------------------------------------------------------ Llama (grouped-query too)
class BetLlamaConfig(LlamaConfig, BetConfigFields):
    model_type = "bet_llama"


class BetLlamaAttention(BetAttentionMixin, LlamaAttention):
    """Llama's self-attention (q, k, v, o projections, rotary embeddings, grouped-query heads) with BET."""

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        heads = config.num_attention_heads
        self.init_bet(config, heads, heads // self.num_key_value_groups, self.head_dim)

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q, k, v = (proj(hidden_states).view(shape).transpose(1, 2) for proj in (self.q_proj, self.k_proj, self.v_proj))
        q, k = apply_rotary_pos_emb(q, k, *position_embeddings)
        out, weights = self.bet_attend(q, k, v, attention_mask, cache, self.attention_dropout if self.training else 0.0)
        return self.o_proj(out), weights


class BetLlamaForCausalLM(BetModelMixin, LlamaForCausalLM):
    config_class = BetLlamaConfig
    bet_attention_class = BetLlamaAttention
    forward = train_without_cache(LlamaForCausalLM.forward)

    def attention_slots(self):
        return [(layer, "self_attn") for layer in self.model.layers]


BET_CLASSES = {GPT2LMHeadModel: BetGPT2LMHeadModel, LlamaForCausalLM: BetLlamaForCausalLM}
CONFIG_KEYS_NOT_COPIED = ("model_type", "architectures", "transformers_version")


def to_bet(model, **options):
    """A BET version of a stock ``GPT2LMHeadModel`` / ``LlamaForCausalLM`` with its weights (copied) and new ``w``;
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
