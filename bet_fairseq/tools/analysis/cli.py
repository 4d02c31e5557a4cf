"""``bet-analyze``: decoder self-attention analysis of fairseq checkpoints (the paper's Table 1).

Subcommands::

  bet-analyze stats   CKPT --data DIR [--split valid]         Table 1 statistics (Markdown + JSON)
  bet-analyze topk    CKPT [CKPT2] --data DIR (--indices I,.. | --text FILE)   Table 3 top-k words
  bet-analyze heatmap CKPT --data DIR (--index I | --text FILE [--line N]) --out-dir DIR   PNG per layer/head
  bet-analyze bars    STATS.json [STATS2.json] --out bars.png   CA versus HA per layer

See docs/analysis.md for the definitions and choices.
"""

import argparse
import ast
import json
import os
import sys

from bet_fairseq.errors import InputError, run_tool
from bet_fairseq.files import atomic_write
from .attention_stats import CA_ROWS, HA_OVER, markdown_report, matrix_titles


def _write_atomic(path: str, text: str):
    with atomic_write(path) as f:
        f.write(text)


def _overrides(text):
    if not text:
        return {}
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"--overrides must be a dict, e.g. \"{{'max_source_positions': 2048}}\"; got {text!r}")
    return value


def _int_list(text):
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _head(text):
    if text == "mean":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--head: 'mean' or a head number, got {text!r}") from None


def _add_loading(p):
    p.add_argument("--data", required=True, help="the binarised data directory (fairseq-preprocess --destdir)")
    p.add_argument("--split", default="valid", help="split to read sentences from (default: valid)")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even when CUDA is available")
    p.add_argument("--overrides", type=_overrides, default={},
                   help="extra checkpoint config overrides, a Python dict (like fairseq-generate --model-overrides)")


def build_parser():
    parser = argparse.ArgumentParser(prog="bet-analyze", description=__doc__.replace("``", ""),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("stats", help="CA / HA(mean) / HA(std) / Ratio per decoder layer over a whole split")
    p.add_argument("checkpoint")
    _add_loading(p)
    p.add_argument("--ca-rows", choices=CA_ROWS, default="all",
                   help="rows whose diagonal weight CA averages: all (default, the paper's definition) or "
                        "skip-first (leave out row 0, a sequence's first position, which can only see itself)")
    p.add_argument("--include-first-row", dest="ca_rows", action="store_const", const="all",
                   help="the same as --ca-rows all (the default)")
    p.add_argument("--ha-over", choices=HA_OVER, default="head-mean",
                   help="entries the statistics are taken over: head-mean (default, the paper's definition: the "
                        "head-averaged matrix fairseq reports) or heads (every head's own entries)")
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch (default 4096)")
    p.add_argument("--batch-size", type=int, default=None, help="sentences per batch (default: no limit)")
    p.add_argument("--max-batches", type=int, default=None, help="stop after this many batches (a quick look)")
    p.add_argument("--out", default="attention_stats",
                   help="output prefix: writes PREFIX.json and PREFIX.md (default: ./attention_stats)")
    p.add_argument("--label", default=None, help="name of the model in the Markdown heading")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")

    p = sub.add_parser("topk", help="top-k attended words per layer for given sentences, one or two checkpoints")
    p.add_argument("checkpoints", nargs="+", metavar="CKPT", help="one or two checkpoints (side by side)")
    _add_loading(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--indices", type=_int_list, help="sentence numbers in --split, e.g. 0,5,17")
    src.add_argument("--text", help="a text file, one sentence a line, tokenised (and BPE'd) like the training "
                                    "data; translation models: 'source<TAB>target'")
    p.add_argument("--labels", nargs="+", default=None, help="model names for the column headings")
    p.add_argument("--k", type=int, default=3, help="words per cell (default 3)")
    p.add_argument("--head", type=_head, default=None, help="'mean' over heads (default) or a head number")
    p.add_argument("--matrix", choices=("final", "first_pass"), default="final",
                   help="final = A' (default); first_pass = BET(SF)'s A")
    p.add_argument("--positions", type=_int_list, default=None,
                   help="decoder positions to show (0 = the first, which predicts the first word); default all")
    p.add_argument("--bpe-marker", default="@@", help="subword continuation marker merged for display ('' = none)")
    p.add_argument("--out", default=None, help="write the Markdown here (also printed)")

    p = sub.add_parser("heatmap", help="attention heatmap PNG per decoder layer and head for one sentence")
    p.add_argument("checkpoint")
    _add_loading(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--index", type=int, help="sentence number in --split")
    src.add_argument("--text", help="text file as for topk")
    p.add_argument("--line", type=int, default=1, help="line of --text to draw (1-based, default 1)")
    p.add_argument("--layers", type=_int_list, default=None, help="decoder layers (1-based), default all")
    p.add_argument("--heads", default="all",
                   help="'all' (every head and the mean, default) or a comma-separated list of head numbers "
                        "and/or 'mean', e.g. 0,3,mean")
    p.add_argument("--matrix", choices=("final", "first_pass"), default="final")
    p.add_argument("--out-dir", required=True, help="folder for layer{L}_head{H}.png / layer{L}_mean.png")
    p.add_argument("--prefix", default="", help="file name prefix")

    p = sub.add_parser("bars", help="bar plot of CA versus HA per layer from one or two `stats` JSON files")
    p.add_argument("stats", nargs="+", metavar="STATS.json")
    p.add_argument("--labels", nargs="+", default=None)
    p.add_argument("--matrix", nargs="+", choices=("final", "first_pass"), default=["final"],
                   help="matrix to draw: one for all files, or one per file (e.g. final first_pass)")
    p.add_argument("--out", required=True, help="PNG file")
    p.add_argument("--title", default="decoder self-attention: CA vs HA")
    return parser


# ----------------------------------------------------------------------------------------------
def cmd_stats(args):
    from tqdm import tqdm

    from bet_fairseq.attention.capture import decoder_self_attentions
    from .attention_stats import collect_attention_stats
    from .loading import load_checkpoint, split_batches

    loaded = load_checkpoint(args.checkpoint, args.data, args.overrides, args.cpu)
    attentions = decoder_self_attentions(loaded.model, convert=True)
    batches, n_split = split_batches(loaded, args.split, args.max_tokens, args.batch_size)
    total = len(batches) if args.max_batches is None else min(len(batches), args.max_batches)

    def progress(it):
        bar = tqdm(it, total=total, desc=f"bet-analyze {args.split}", unit="batch", file=sys.stderr,
                   disable=args.no_progress)
        for i, sample in enumerate(bar):
            if args.max_batches is not None and i >= args.max_batches:
                break
            yield sample

    acc = collect_attention_stats(loaded.model, attentions, batches, loaded.model.decoder.padding_idx,
                                  device=loaded.device, progress=progress, ca_rows=args.ca_rows,
                                  ha_over=args.ha_over)
    result = {
        "checkpoint": os.path.abspath(args.checkpoint),
        "data": os.path.abspath(args.data),
        "split": args.split,
        "arch": loaded.arch,
        "self_attn_mode": loaded.self_attn_mode,
        "task": "translation" if loaded.is_translation else "language_modeling",
        "sentences": acc.sentences,
        "sentences_in_split": n_split,
        "tokens": acc.tokens,
        **acc.definition(),
        "padding": "excluded (rows of padding queries and entries on padding keys)",
        "matrices": acc.result(),
    }
    result["matrix_titles"] = matrix_titles(result["matrices"])
    md = markdown_report(result, args.label or _short(args.checkpoint))
    _write_atomic(args.out + ".json", json.dumps(result, indent=2) + "\n")
    _write_atomic(args.out + ".md", md)
    print(md)
    print(f"wrote {args.out}.json and {args.out}.md ({acc.sentences} of {n_split} sentences)", file=sys.stderr)


def _samples(loaded, args):
    """(title, sample) pairs for --indices / --text."""
    from .loading import read_text_lines, sample_from_index, sample_from_text

    if getattr(args, "indices", None) is not None:
        return [(f"{args.split} sentence {i}", sample_from_index(loaded, args.split, i)) for i in args.indices]
    lines = read_text_lines(args.text)
    if not lines:
        raise InputError(f"{args.text}: no sentences")
    return [(f"{os.path.basename(args.text)} line {n}", sample_from_text(loaded, line, f"{args.text}:{n}"))
            for n, line in enumerate(lines, 1) if line.strip()]


def cmd_topk(args):
    from .loading import load_checkpoint
    from .topk import sentence_attention, topk_markdown

    if len(args.checkpoints) > 2:
        raise InputError("topk compares at most two checkpoints")
    labels = args.labels or [_short(c) for c in args.checkpoints]
    if len(labels) != len(args.checkpoints):
        raise InputError(f"--labels: {len(labels)} names for {len(args.checkpoints)} checkpoints")
    if args.k < 1:
        raise InputError("--k must be >= 1")
    per_model = []
    for ckpt in args.checkpoints:
        loaded = load_checkpoint(ckpt, args.data, args.overrides, args.cpu)
        per_model.append([(title, sentence_attention(loaded, s)) for title, s in _samples(loaded, args)])
    marker = args.bpe_marker or None
    parts = [f"### Top-{args.k} attended words per decoder layer "
             f"({'mean over heads' if args.head is None else f'head {args.head}'}, matrix {args.matrix})\n"]
    for i, (title, _) in enumerate(per_model[0]):
        parts.append(topk_markdown(title, [m[i][1] for m in per_model], labels, args.k, args.head, args.matrix,
                                   args.positions, marker))
    md = "\n".join(parts)
    if args.out:
        _write_atomic(args.out, md)
    print(md)


def _parse_heads(text, heads_total):
    """'all' -> every head and the mean; else a comma-separated list of head numbers and/or 'mean'."""
    if text.strip() == "all":
        return list(range(heads_total)), True
    heads, mean = [], False
    for item in text.split(","):
        item = item.strip()
        if item == "mean":
            mean = True
            continue
        try:
            h = int(item)
        except ValueError:
            raise InputError(f"--heads: expected 'all', 'mean' or head numbers, got {item!r}") from None
        if not 0 <= h < heads_total:
            raise InputError(f"--heads: head {h} out of range 0..{heads_total - 1}")
        heads.append(h)
    if not heads and not mean:
        raise InputError("--heads: nothing to draw")
    return heads, mean


def _short(checkpoint):
    """``folder/file.pt``: checkpoints are usually told apart by their folder."""
    path = os.path.abspath(checkpoint)
    return os.path.join(os.path.basename(os.path.dirname(path)), os.path.basename(path))


def cmd_heatmap(args):
    from .loading import load_checkpoint, read_text_lines, sample_from_index, sample_from_text
    from .plots import heatmap
    from .topk import sentence_attention

    loaded = load_checkpoint(args.checkpoint, args.data, args.overrides, args.cpu)
    if args.index is not None:
        sample = sample_from_index(loaded, args.split, args.index)
        what = f"{args.split} #{args.index}"
    else:
        lines = read_text_lines(args.text)
        if not 1 <= args.line <= len(lines):
            raise InputError(f"--line {args.line}: {args.text} has {len(lines)} lines")
        sample = sample_from_text(loaded, lines[args.line - 1], f"{args.text}:{args.line}")
        what = f"{os.path.basename(args.text)}:{args.line}"
    att = sentence_attention(loaded, sample)
    layers = att["first_pass"] if args.matrix == "first_pass" else att["final"]
    if layers is None:
        raise InputError(f"{args.checkpoint}: no first-pass matrix (not a BET(SF) model); use --matrix final")
    chosen = args.layers or list(range(1, len(layers) + 1))
    for layer in chosen:
        if not 1 <= layer <= len(layers):
            raise InputError(f"--layers: layer {layer} out of range 1..{len(layers)}")
    heads_total = layers[0].size(0)
    heads, mean = _parse_heads(args.heads, heads_total)
    tag = "A (first pass)" if args.matrix == "first_pass" else "attention"
    written = []
    for layer in chosen:
        m = layers[layer - 1]
        jobs = [(f"head{h}", m[h], f"head {h}") for h in heads] + ([("mean", m.mean(0), "mean of heads")] if mean else [])
        for name, matrix, desc in jobs:
            path = os.path.join(args.out_dir, f"{args.prefix}layer{layer}_{name}.png")
            heatmap(matrix, att["input"], path, f"{_short(args.checkpoint)} {what}: {tag}, layer {layer}, {desc}")
            written.append(path)
    for path in written:
        print(path)


def cmd_bars(args):
    from .plots import ca_ha_bars

    if len(args.stats) > 2:
        raise InputError("bars draws one or two stats files")
    labels = args.labels or [os.path.splitext(os.path.basename(p))[0] for p in args.stats]
    if len(labels) != len(args.stats):
        raise InputError(f"--labels: {len(labels)} names for {len(args.stats)} stats files")
    matrices = args.matrix * len(args.stats) if len(args.matrix) == 1 else args.matrix
    if len(matrices) != len(args.stats):
        raise InputError(f"--matrix: {len(args.matrix)} names for {len(args.stats)} stats files")
    series = []
    for path, label, matrix in zip(args.stats, labels, matrices):
        if not os.path.isfile(path):
            raise InputError(f"stats file not found: {path}")
        with open(path, encoding="utf-8") as f:
            try:
                result = json.load(f)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}: not a bet-analyze stats JSON file ({e})") from None
        if "matrices" not in result:
            raise InputError(f"{path}: not a bet-analyze stats JSON file (no 'matrices')")
        if matrix not in result["matrices"]:
            raise InputError(f"{path}: has no {matrix!r} matrix (only {sorted(result['matrices'])})")
        series.append((label, result["matrices"][matrix]))
    ca_ha_bars(series, args.out, args.title)
    print(args.out)


COMMANDS = {"stats": cmd_stats, "topk": cmd_topk, "heatmap": cmd_heatmap, "bars": cmd_bars}


def check_outputs(args):
    """The files and folders a subcommand writes can be written: checked before any checkpoint loads."""
    from bet_fairseq.errors import check_writable_file, check_writable_folder

    if args.command == "stats":
        check_writable_file(args.out + ".json", "--out")
    elif args.command == "heatmap":
        check_writable_folder(args.out_dir, "--out-dir")
    elif getattr(args, "out", None):
        check_writable_file(args.out, "--out")


def main(argv=None):
    """``bet-analyze``: the exit status (bad input: one line, status 2)."""
    return run_tool("bet-analyze", _main, argv)


def _main(argv=None):
    args = build_parser().parse_args(argv)
    check_outputs(args)
    COMMANDS[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
