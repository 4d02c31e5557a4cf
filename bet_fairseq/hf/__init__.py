"""BET in Hugging Face transformers (5.x): GPT-2 and Llama-style causal LMs whose self-attention is BET(SF) or a
diagonal ablation, trained, saved, loaded and generating (greedy, sampling, beam search) with the key/value cache.

Importing this package registers the model types ``bet_gpt2`` and ``bet_llama`` with ``AutoConfig`` and
``AutoModelForCausalLM``, so a saved BET model loads with ``AutoModelForCausalLM.from_pretrained(path)``.
Needs ``pip install 'bet-fairseq[hf]'`` (transformers); no fairseq. Guide: docs/huggingface.md.
"""

try:
    import transformers  # noqa: F401
except ImportError as err:  # pragma: no cover - the message is the point
    raise ImportError("bet_fairseq.hf needs transformers 5: pip install 'bet-fairseq[hf]'") from err

from transformers import AutoConfig, AutoModelForCausalLM

from .attention import SELF_ATTN_MODES, BetConfigFields  # noqa: F401
from .models import (  # noqa: F401
    BetGPT2Attention,
    BetGPT2Config,
    BetGPT2LMHeadModel,
    BetLlamaAttention,
    BetLlamaConfig,
    BetLlamaForCausalLM,
    to_bet,
)

for _config, _model in ((BetGPT2Config, BetGPT2LMHeadModel), (BetLlamaConfig, BetLlamaForCausalLM)):
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModelForCausalLM.register(_config, _model, exist_ok=True)
