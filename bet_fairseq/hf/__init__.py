"""BET in Hugging Face transformers (5.x): GPT-2, Llama, Qwen2, Qwen3, Mistral, OLMo-2, Phi-3 and Gemma causal LMs whose
self-attention is BET(SF) or a diagonal ablation, trained (eager or ``torch.compile(fullgraph=True)``), exported
(``torch.export``), saved, loaded and generating (greedy, sampling, beam search) with the dynamic or static cache.

Importing this package registers the model types (``bet_gpt2``, ``bet_llama``, ``bet_qwen2`` ...) with ``AutoConfig``
and ``AutoModelForCausalLM``, so a saved BET model loads with ``AutoModelForCausalLM.from_pretrained(path)``.
transformers' text-generation pipeline and test helpers also read a fixed name table
(``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``) that has no public way to register in: the pipeline logs that the class is
"not supported" and then runs it.
Needs ``pip install 'bet-fairseq[hf]'`` (transformers); no fairseq. Guide: docs/huggingface.md.
"""

try:
    import transformers  # noqa: F401
except ImportError as err:  # pragma: no cover - the message is the point
    raise ImportError("bet_fairseq.hf needs transformers 5: pip install 'bet-fairseq[hf]'") from err

from transformers import AutoConfig, AutoModelForCausalLM

from .attention import SELF_ATTN_MODES, BetConfigFields, BetStaticCache, BetStaticLayer  # noqa: F401
from .models import *  # noqa: F401,F403 (the Bet* classes, BET_CLASSES and to_bet: models.__all__)

for _model in BET_CLASSES.values():
    AutoConfig.register(_model.config_class.model_type, _model.config_class, exist_ok=True)
    AutoModelForCausalLM.register(_model.config_class, _model, exist_ok=True)
