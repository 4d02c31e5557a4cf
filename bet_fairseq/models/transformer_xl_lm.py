"""Transformer-XL language models (Dai et al. 2019), the "Transformer-XL" row of Table 2.

Segment-level recurrence: each layer attends to ``[memory ; segment]`` with relative positional
attention (the ``relative`` variant, ``attention/relative.py``), where the memory holds that layer's input hidden states of
the last ``--mem-len`` positions of the previous segments, detached (no gradient flows into it). The
memory lives on the decoder between forward calls, so the data must come as contiguous segments:
``--task bet_truncated_bptt_lm --batch-size B --tokens-per-sample T``. It is cleared at the start of
a stream (segment 0), when the batch size changes, and when the model switches train <-> eval.

Layers are pre-norm with a final LayerNorm, embeddings scaled by sqrt(dim), dropout ``--dropout`` on
embeddings and sublayer outputs, ``--attention-dropout`` on attention probabilities, like the other LM
rows (fairseq's transformer_lm); no absolute positions (the relative terms carry position).
Architectures at the sizes of the other LM rows (the catalog's LM sizes, 6 layers): ``transformer_xl_lm``
(WikiText-2), ``transformer_xl_lm_wikitext103``, ``transformer_xl_lm_enwik8``.

Generation (fairseq-generate / fairseq-interactive, ``--task language_modeling``) is incremental: each call
computes only the positions not seen yet (fairseq's convention: the whole prefix is passed every step) and
each layer's attention caches the keys and values of the earlier positions, batch-first (beam search
reorders them). A prompt and the tokens generated after it are one segment of a new stream: the memory kept
between scoring calls is neither used nor changed, and the result equals the full forward of the prefix
with no memory (segment 0), relative logits and ``--clamp-len`` included. Without ``--same-length`` every
position sees the whole prefix, so a step costs more as the text grows and distances grow past those seen
in training (``--clamp-len`` bounds them); with ``--same-length`` every position sees its last ``--mem-len``
positions (itself included), as in the reference code's evaluation, so the cache keeps ``mem_len - 1``
positions per layer and a step costs the same however long the text (``--model-overrides
"{'same_length': True}"`` turns it on for a model trained without it). ``memory=`` (layer inputs of an earlier
segment, as ``extra["layer_inputs"]``) may be given on the first incremental call only: it is cached as a
context before the prompt, as in the full forward with that memory. The model loads under any task (for
generation), but with ``--mem-len > 0`` it refuses to train or score under a task without contiguous
segments, at its first scoring forward.
"""

import math
from dataclasses import dataclass, field
from typing import List, Optional

import torch
from torch import Tensor, nn

from fairseq import utils
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models import FairseqIncrementalDecoder, FairseqLanguageModel, register_model, register_model_architecture
from fairseq.modules import LayerNorm
from fairseq.modules.fairseq_dropout import FairseqDropout

from ..attention.relative import RelativeSelfAttention
from ..compat import register_help
from ..tasks.truncated_bptt import TruncatedBPTTLanguageModelingTask
from .. import catalog
from .defaults import apply_lm_size, fill
from .task_fit import check_task_fits
from ..errors import InputError


@dataclass
class TransformerXLConfig(FairseqDataclass):
    decoder_embed_dim: int = field(default=300, metadata={"help": "model / embedding dimension (even)"})
    decoder_ffn_embed_dim: int = field(default=1200, metadata={"help": "FFN hidden dimension"})
    decoder_layers: int = field(default=6, metadata={"help": "number of layers"})
    decoder_attention_heads: int = field(default=4, metadata={"help": "attention heads per layer"})
    dropout: float = field(default=0.1, metadata={"help": "dropout on embeddings and sublayer outputs"})
    attention_dropout: float = field(default=0.0, metadata={"help": "dropout on attention probabilities"})
    activation_fn: ChoiceEnum(utils.get_available_activation_fns()) = field(
        default="relu", metadata={"help": "FFN activation"})
    share_decoder_input_output_embed: bool = field(default=False, metadata={"help": "tie input and output embeddings"})
    mem_len: int = field(
        default=150, metadata={"help": "Transformer-XL: hidden states of this many previous positions kept as memory "
                                        "per layer (0: no recurrence); eval-lm may override it"})
    same_length: bool = field(
        default=False, metadata={"help": "Transformer-XL: every query sees the same number of positions, the last "
                                         "--mem-len (itself included), as the reference code's evaluation"})
    clamp_len: int = field(
        default=-1, metadata={"help": "Transformer-XL: distances beyond this share its relative embedding, as the "
                                      "reference code's evaluation (-1: no clamping)"})


def validate_txl(cfg):
    dim, heads = cfg.decoder_embed_dim, cfg.decoder_attention_heads
    if heads < 1 or dim % heads:
        raise InputError(f"--decoder-embed-dim {dim} must be divisible by --decoder-attention-heads {heads}")
    if dim % 2:
        raise InputError(f"--decoder-embed-dim must be even for Transformer-XL's sin/cos positions, got {dim}")
    if cfg.mem_len is None or cfg.mem_len < 0:
        raise InputError(f"--mem-len must be an integer >= 0, got {cfg.mem_len}")
    if cfg.decoder_layers < 1:
        raise InputError(f"--decoder-layers must be >= 1, got {cfg.decoder_layers}")
    if getattr(cfg, "same_length", False) and cfg.mem_len < 1:
        raise InputError("--same-length needs --mem-len >= 1 (the number of positions every query sees)")
    if getattr(cfg, "clamp_len", -1) is not None and getattr(cfg, "clamp_len", -1) < -1:
        raise InputError(f"--clamp-len must be -1 (none) or a distance >= 0, got {cfg.clamp_len}")


class TransformerXLLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        dim = cfg.decoder_embed_dim
        self.self_attn = RelativeSelfAttention(dim, cfg.decoder_attention_heads, dropout=cfg.attention_dropout, bias=False)
        self.self_attn_layer_norm = LayerNorm(dim)
        self.fc1 = nn.Linear(dim, cfg.decoder_ffn_embed_dim)
        self.fc2 = nn.Linear(cfg.decoder_ffn_embed_dim, dim)
        self.final_layer_norm = LayerNorm(dim)
        self.activation_fn = utils.get_activation_fn(str(cfg.activation_fn))
        self.dropout_module = FairseqDropout(cfg.dropout, module_name=self.__class__.__name__)

    def forward(self, x: Tensor, memory: Optional[Tensor], incremental_state=None) -> Tensor:
        """x (B, T, E), memory (B, M, E) of this layer's earlier inputs (already detached);
        ``incremental_state``: the attention adds x's keys/values to those cached."""
        normed = self.self_attn_layer_norm(x).transpose(0, 1)  # (T, B, E), as fairseq's attention takes it
        context = None if memory is None else torch.cat([self.self_attn_layer_norm(memory).transpose(0, 1), normed])
        h, _ = self.self_attn(normed, context, context, incremental_state=incremental_state, need_weights=False)
        x = x + self.dropout_module(h.transpose(0, 1))
        h = self.fc2(self.dropout_module(self.activation_fn(self.fc1(self.final_layer_norm(x)))))
        return x + self.dropout_module(h)


class TransformerXLDecoder(FairseqIncrementalDecoder):
    def __init__(self, cfg, dictionary):
        super().__init__(dictionary)
        validate_txl(cfg)
        dim = cfg.decoder_embed_dim
        self.mem_len = cfg.mem_len
        self.embed_tokens = nn.Embedding(len(dictionary), dim, padding_idx=dictionary.pad())
        nn.init.normal_(self.embed_tokens.weight, mean=0, std=dim ** -0.5)
        nn.init.constant_(self.embed_tokens.weight[dictionary.pad()], 0)
        self.embed_scale = math.sqrt(dim)
        self.dropout_module = FairseqDropout(cfg.dropout, module_name=self.__class__.__name__)
        self.layers = nn.ModuleList(TransformerXLLayer(cfg) for _ in range(cfg.decoder_layers))
        clamp_len = getattr(cfg, "clamp_len", -1)
        for layer in self.layers:
            layer.self_attn.clamp_len = None if clamp_len is None or clamp_len < 0 else int(clamp_len)
            layer.self_attn.same_length = cfg.mem_len if getattr(cfg, "same_length", False) else None
        self.layer_norm = LayerNorm(dim)
        if cfg.share_decoder_input_output_embed:
            self.output_projection = None
        else:
            self.output_projection = nn.Linear(dim, len(dictionary), bias=False)
            nn.init.normal_(self.output_projection.weight, mean=0, std=dim ** -0.5)
        self.memory: Optional[List[Tensor]] = None
        # Set by the model for a task without contiguous segments: scoring with memory is an error there,
        # generation (which never uses the kept memory) is not.
        self.segments_required: Optional[str] = None

    def reset_memory(self):
        self.memory = None

    def train(self, mode: bool = True):
        if mode != self.training:  # train <-> valid: a different stream begins
            self.reset_memory()
        return super().train(mode)

    def forward(self, prev_output_tokens, src_lengths=None, incremental_state=None, features_only=False,
                segment_index=None, memory: Optional[List[Tensor]] = None, **unused):
        """``memory``: explicit per-layer memory (B, M, E) to use instead of (and without updating) the
        memory kept from the previous call. With ``incremental_state``: the features and logits of the
        positions of ``prev_output_tokens`` not seen by the earlier calls only."""
        x, extra = self.extract_features(prev_output_tokens, segment_index=segment_index, memory=memory,
                                         incremental_state=incremental_state)
        return (x if features_only else self.output_layer(x)), extra

    def extract_features(self, prev_output_tokens, segment_index=None, memory=None, incremental_state=None,
                         **unused):
        if incremental_state is not None:
            return self.extract_incremental(prev_output_tokens, incremental_state, memory)
        explicit = memory is not None
        if not explicit:
            if self.mem_len > 0 and self.segments_required is not None:
                raise ValueError(self.segments_required)
            first = segment_index is not None and int(segment_index) == 0
            memory = self.memory
            if first or self.mem_len == 0 or (memory is not None and memory[0].size(0) != prev_output_tokens.size(0)):
                memory = None
        x = self.dropout_module(self.embed_scale * self.embed_tokens(prev_output_tokens))
        inputs = []
        for i, layer in enumerate(self.layers):
            inputs.append(x)
            x = layer(x, None if memory is None else memory[i])
        if not explicit and self.mem_len > 0:
            with torch.no_grad():
                self.memory = [
                    (h if memory is None else torch.cat([memory[i], h], dim=1))[:, -self.mem_len :].detach()
                    for i, h in enumerate(inputs)
                ]
        return self.layer_norm(x), {"attn": [None], "inner_states": inputs + [x], "layer_inputs": inputs}

    def extract_incremental(self, prev_output_tokens, incremental_state, memory=None):
        """One generation call: the positions after the ``seen`` ones of earlier calls, attending to the
        cached keys/values of the earlier positions (and of ``memory``, on the first call)."""
        state = self.get_incremental_state(incremental_state, "positions")
        seen = 0 if state is None else int(state["seen"])
        if memory is not None and seen:
            raise ValueError("transformer_xl_lm: memory= goes with the first incremental call only (it is cached "
                             "with the prompt's keys)")
        new_tokens = prev_output_tokens[:, seen:]
        if new_tokens.size(1) == 0:
            raise ValueError(f"transformer_xl_lm: incremental decoding takes the whole prefix each call; got "
                             f"{prev_output_tokens.size(1)} tokens, {seen} of them already decoded")
        x = self.dropout_module(self.embed_scale * self.embed_tokens(new_tokens))
        inputs = []
        for i, layer in enumerate(self.layers):
            inputs.append(x)
            x = layer(x, None if memory is None else memory[i], incremental_state=incremental_state)
        self.set_incremental_state(incremental_state, "positions",
                                   {"seen": torch.tensor(seen + new_tokens.size(1))})
        return self.layer_norm(x), {"attn": [None], "inner_states": inputs + [x], "layer_inputs": inputs}

    def output_layer(self, features):
        if self.output_projection is None:
            return nn.functional.linear(features, self.embed_tokens.weight)
        return self.output_projection(features)

    def max_positions(self):
        return int(1e9)  # relative positions: no length limit


@register_model("bet_transformer_xl_lm", dataclass=TransformerXLConfig)
class TransformerXLLanguageModel(FairseqLanguageModel):
    @classmethod
    def build_model(cls, args, task):
        check_task_fits(args, task, "lm")
        validate_txl(args)
        decoder = TransformerXLDecoder(args, task.target_dictionary)
        if args.mem_len > 0 and not isinstance(task, TruncatedBPTTLanguageModelingTask):
            # An error at the first scoring forward, not here: generation (--task language_modeling) is fine.
            decoder.segments_required = (
                f"transformer_xl_lm with --mem-len {args.mem_len} needs --task bet_truncated_bptt_lm (contiguous "
                f"segments; the memory would otherwise mix unrelated batches) to train or score, got --task "
                f"{getattr(getattr(task, 'cfg', None), '_name', None) or type(task).__name__}")
        return cls(decoder)


def _register(arch_name, size):
    def architecture(args):
        apply_lm_size(args, size)
        fill(args, dropout=0.1, attention_dropout=0.0, activation_fn="relu", share_decoder_input_output_embed=False,
             mem_len=150)

    architecture.__name__ = arch_name
    register_model_architecture("bet_transformer_xl_lm", arch_name)(architecture)


for _size in catalog.sizes():
    if _size.kind == "lm":
        _register(catalog.arch_name("transformer_xl", _size), _size)

register_help("bet-fairseq Transformer-XL (--arch transformer_xl_lm[_wikitext103|_enwik8])", TransformerXLConfig)
