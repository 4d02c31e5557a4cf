"""Translation and LM models whose decoder self-attention is a published baseline of BET_SPEC
Table 2 (``bet_fairseq.modules.baseline_attention``): Yang et al. 2018 (``localness``), Zhao et
al. 2019 (``sparse_topk``) and the Hopfield layer of Ramsauer et al. 2020 (``hopfield``).

Sizes are those of the other rows: translation ``{name}_iwslt`` (fairseq's transformer_iwslt_de_en)
and ``{name}_wmt_en_de``; language modelling ``{name}_lm`` (WikiText-2 sizes),
``{name}_lm_wikitext103`` and ``{name}_lm_enwik8`` (``LM_SIZES``). Models ``baseline_transformer``
and ``baseline_transformer_lm``; ``--self-attn-baseline`` is stored in the checkpoint.
"""

from dataclasses import dataclass

from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import transformer_iwslt_de_en, transformer_wmt_en_de

from ..cli_help import register_help
from ..modules.baseline_attention import BASELINES
from ..modules.baseline_decoder import (
    BaselineAttentionConfig,
    BaselineTransformerDecoder,
    baseline_settings,
    reject_bet_modes,
)
from ..modules.bird_eye_config import set_attention_defaults
from .bet_transformer import BirdEyeTransformerModel
from .bet_transformer_lm import (
    LM_SIZES,
    BirdEyeLanguageModelConfig,
    BirdEyeTransformerLanguageModel,
    apply_lm_size,
    bet_lm_base,
)

register_help(
    "bet-fairseq baseline decoder self-attention (--arch localness_* / sparse_topk_* / hopfield_*)",
    BaselineAttentionConfig,
)


def _check(args):
    baseline_settings(args)  # fail on bad options before anything is built
    reject_bet_modes(args)


@register_model("baseline_transformer")
class BaselineTransformerModel(BirdEyeTransformerModel):
    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        gen_parser_from_dataclass(parser, BaselineAttentionConfig(), delete_default=True, with_prefix="")

    @classmethod
    def build_model(cls, args, task):
        baseline_transformer_base(args)
        _check(args)
        return super().build_model(args, task)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return BaselineTransformerDecoder(
            args, tgt_dict, embed_tokens, no_encoder_attn=getattr(args, "no_cross_attention", False)
        )


@register_model_architecture("baseline_transformer", "baseline_transformer")
def baseline_transformer_base(args):
    set_attention_defaults(args)
    transformer_wmt_en_de(args)


@dataclass
class BaselineLanguageModelConfig(BirdEyeLanguageModelConfig, BaselineAttentionConfig):
    pass


@register_model("baseline_transformer_lm", dataclass=BaselineLanguageModelConfig)
class BaselineTransformerLanguageModel(BirdEyeTransformerLanguageModel):
    @classmethod
    def build_model(cls, args, task):
        bet_lm_base(args)
        _check(args)
        # As BirdEyeTransformerLanguageModel: keep fairseq's embeddings, rebuild the decoder.
        embed_tokens = super(BirdEyeTransformerLanguageModel, cls).build_model(args, task).decoder.embed_tokens
        return cls(BaselineTransformerDecoder(args, task.target_dictionary, embed_tokens, no_encoder_attn=True))


def _set_baseline(args, baseline):
    if getattr(args, "self_attn_baseline", None) is None:
        args.self_attn_baseline = baseline


def _register_translation(arch_name, size_fn, baseline):
    def architecture(args):
        _set_baseline(args, baseline)
        set_attention_defaults(args)
        size_fn(args)

    architecture.__name__ = arch_name
    architecture.__doc__ = f"{size_fn.__name__} sizes, decoder self-attention baseline {baseline}"
    register_model_architecture("baseline_transformer", arch_name)(architecture)


def _register_lm(arch_name, size, baseline):
    def architecture(args):
        _set_baseline(args, baseline)
        apply_lm_size(args, size)
        bet_lm_base(args)

    architecture.__name__ = arch_name
    architecture.__doc__ = f"{size} LM sizes, self-attention baseline {baseline}"
    register_model_architecture("baseline_transformer_lm", arch_name)(architecture)


for _baseline in BASELINES:
    _register_translation(f"{_baseline}_iwslt", transformer_iwslt_de_en, _baseline)
    _register_translation(f"{_baseline}_wmt_en_de", transformer_wmt_en_de, _baseline)
    for _size in LM_SIZES:
        _register_lm(f"{_baseline}_lm" + ("" if _size == "wikitext2" else f"_{_size}"), _size, _baseline)
