"""What the study derives from a finished run's ``checkpoint_best.pt`` besides its test scores, made with the run
(the report only reads them, from the run's folder or its kept copy): Table 1's statistics of the decoder
self-attention on ``valid`` and, on translation, the heatmap's attention of one validation sentence. Both for the
analysed rows' first seed (``plan.ANALYSED``), at a scale that analyses (``analysis_batches``)."""

import itertools
import os

from bet_fairseq import catalog
from bet_fairseq.tools import executor, markers
from . import plan, store

# the heatmap's sentence: the first validation sentence of this many target tokens (the same for every run of a
# dataset, so the analysed rows' heatmaps show the same sentence)
HEATMAP_LENGTH = (8, 12)


def wanted(run, scale):
    """The derived files ``run`` has (names in its folder)."""
    if run.row not in plan.ANALYSED or run.setting or run.seed != 1 or not plan.SCALE_TABLE[scale].analysis_batches:
        return ()
    return (store.TABLE1, store.ATTENTION) if catalog.dataset(run.dataset).kind == "mt" else (store.TABLE1,)


def table1(checkpoint, data, max_batches):
    """Table 1 statistics (the paper's definitions) of a checkpoint's decoder self-attention on ``valid``."""
    from bet_fairseq.attention.capture import decoder_self_attentions
    from ..analysis.attention_stats import collect_attention_stats
    from ..analysis.loading import load_checkpoint, split_batches

    loaded = load_checkpoint(checkpoint, data, cpu=not executor.has_cuda())
    attentions = decoder_self_attentions(loaded.model, convert=True)
    batches, n_split = split_batches(loaded, "valid")
    if max_batches:
        batches = itertools.islice(batches, max_batches)
    acc = collect_attention_stats(loaded.model, attentions, batches, loaded.model.decoder.padding_idx,
                                  device=loaded.device)
    return {"checkpoint": checkpoint, "split": "valid", "sentences": acc.sentences, "sentences_in_split": n_split,
            "tokens": acc.tokens, **acc.definition(), "matrices": acc.result()}


def attention(checkpoint, data):
    """The decoder self-attention of the heatmap's validation sentence, mean over heads, every layer:
    ``{"split", "index", "tokens", "final", "first_pass"}``."""
    import torch

    from ..analysis.loading import load_checkpoint, load_split, sample_from_index
    from ..analysis.topk import sentence_attention

    low, high = HEATMAP_LENGTH
    with torch.no_grad():
        loaded = load_checkpoint(checkpoint, data, cpu=True)
        sizes = load_split(loaded, "valid").tgt_sizes
        index = next((i for i, n in enumerate(sizes) if low <= n <= high), 0)
        att = sentence_attention(loaded, sample_from_index(loaded, "valid", index))
    head_mean = {k: None if att[k] is None else [[[round(float(x), 5) for x in q] for q in m.mean(0)]
                                                 for m in att[k]] for k in ("final", "first_pass")}
    return {"split": "valid", "index": index, "tokens": att["input"], **head_mean}


def make(run, scale, save, checkpoint, bin_dir):
    """Write the derived files ``run`` lacks (each a marker); returns Table 1's path, or None when it has none."""
    made = {store.TABLE1: lambda: table1(checkpoint, bin_dir, plan.SCALE_TABLE[scale].analysis_batches),
            store.ATTENTION: lambda: attention(checkpoint, bin_dir)}
    for name in wanted(run, scale):
        path = os.path.join(save, name)
        if os.path.exists(path) and markers.problem(path) is None:
            continue
        with executor.quiet_logging():
            markers.write(path, made[name]())
    return os.path.join(save, store.TABLE1) if store.TABLE1 in wanted(run, scale) else None
