#!/usr/bin/env python
"""Train a tiny BET(SF) and a tiny vanilla transformer on Multi30k De->En and print both BLEU scores.

A few minutes on a laptop CPU. The two models share data, sizes, seed and schedule; only the
decoder self-attention differs (``--arch bet_sf_iwslt`` vs fairseq's ``transformer_iwslt_de_en``,
both shrunk to the same tiny sizes). Everything goes through fairseq's real command-line tools.

  python run/demo_side_by_side.py                       # downloads Multi30k (needs a network)
  python run/demo_side_by_side.py --data-dir DIR        # DIR holds {train,val,test_2016_flickr}.{de,en}[.gz]

Each step is skipped when its output already exists in --work-dir, so an interrupted run resumes.
"""

import argparse
import gzip
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request

MULTI30K_URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw/{name}.{lang}.gz"
SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
USER_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bet_fairseq")
TINY = (
    "--encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 128 --decoder-embed-dim 128 "
    "--encoder-ffn-embed-dim 256 --decoder-ffn-embed-dim 256 --encoder-attention-heads 4 "
    "--decoder-attention-heads 4"
).split()
MODELS = (("vanilla", "transformer_iwslt_de_en"), ("bet_sf", "bet_sf_iwslt"))


def log(msg):
    print(f"[demo] {msg}", flush=True)


def fail(msg):
    sys.exit(f"demo_side_by_side: error: {msg}")


def find_raw(data_dir, name, lang):
    for folder in (data_dir, os.path.join(data_dir, "raw")):
        for suffix in ("", ".gz"):
            path = os.path.join(folder, f"{name}.{lang}{suffix}")
            if os.path.isfile(path):
                return path
    return None


def read_lines(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def download(raw_dir):
    os.makedirs(raw_dir, exist_ok=True)
    for name in SPLITS.values():
        for lang in ("de", "en"):
            dst = os.path.join(raw_dir, f"{name}.{lang}.gz")
            if os.path.exists(dst):
                continue
            url = MULTI30K_URL.format(name=name, lang=lang)
            log(f"downloading {url}")
            try:
                with urllib.request.urlopen(url, timeout=60) as r, open(dst + ".part", "wb") as f:
                    shutil.copyfileobj(r, f)
            except OSError as e:
                fail(f"cannot download {url} ({e}); without a network pass --data-dir with a local copy")
            os.replace(dst + ".part", dst)
    return raw_dir


def write_atomic(path, lines):
    with open(path + ".part", "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)
    os.replace(path + ".part", path)


def tokenise(data_dir, tok_dir, max_train, max_eval=0):
    """Moses tokenisation + lowercasing (as the IWSLT recipe); train / test capped when asked."""
    from sacremoses import MosesTokenizer

    os.makedirs(tok_dir, exist_ok=True)
    for split, name in SPLITS.items():
        paths = {lang: find_raw(data_dir, name, lang) for lang in ("de", "en")}
        for lang, path in paths.items():
            if path is None:
                fail(f"missing {name}.{lang} (or {name}.{lang}.gz) in {data_dir}")
        outs = {lang: os.path.join(tok_dir, f"{split}.{lang}") for lang in paths}
        if all(os.path.exists(p) for p in outs.values()):
            continue
        texts = {lang: read_lines(p) for lang, p in paths.items()}
        if len(texts["de"]) != len(texts["en"]):
            fail(f"{paths['de']} has {len(texts['de'])} lines but {paths['en']} has {len(texts['en'])}")
        for lang in ("de", "en"):
            for i, line in enumerate(texts[lang], 1):
                if not line.strip():
                    fail(f"{paths[lang]} line {i} is empty (a misaligned or truncated file?)")
        cap = max_train if split == "train" else max_eval
        if cap:
            texts = {lang: t[:cap] for lang, t in texts.items()}
        for lang, lines in texts.items():
            mt = MosesTokenizer(lang=lang)
            write_atomic(outs[lang], [mt.tokenize(x.lower(), escape=False, return_str=True) for x in lines])


def learn_and_apply_bpe(tok_dir, bpe_dir, merges):
    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe

    os.makedirs(bpe_dir, exist_ok=True)
    codes = os.path.join(bpe_dir, "codes")
    if not os.path.exists(codes):
        joint = [line for lang in ("de", "en") for line in read_lines(os.path.join(tok_dir, f"train.{lang}"))]
        out = io.StringIO()
        learn_bpe(io.StringIO("\n".join(joint) + "\n"), out, merges, min_frequency=2)
        write_atomic(codes, out.getvalue().rstrip("\n").split("\n"))
    with open(codes, encoding="utf-8") as f:
        bpe = BPE(f)
    for split in SPLITS:
        for lang in ("de", "en"):
            dst = os.path.join(bpe_dir, f"{split}.{lang}")
            if not os.path.exists(dst):
                write_atomic(dst, [bpe.process_line(x) for x in read_lines(os.path.join(tok_dir, f"{split}.{lang}"))])


def run(cmd, log_path=None):
    log(" ".join(map(str, cmd)))
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, env=env)
    if log_path:
        with open(log_path, "w", encoding="utf-8") as f:
            f.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        fail(f"{cmd[0]} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout + proc.stderr


def binarise(bpe_dir, bin_dir):
    if os.path.exists(os.path.join(bin_dir, "test.de-en.en.idx")):
        return
    if os.path.isdir(bin_dir):
        shutil.rmtree(bin_dir)  # a half-finished earlier attempt
    run(["fairseq-preprocess", "--source-lang", "de", "--target-lang", "en",
         "--trainpref", f"{bpe_dir}/train", "--validpref", f"{bpe_dir}/valid", "--testpref", f"{bpe_dir}/test",
         "--destdir", bin_dir, "--joined-dictionary", "--workers", str(min(4, os.cpu_count() or 1))])


def train_and_score(args, bin_dir, name, arch):
    save = os.path.join(args.work_dir, "checkpoints", name)
    ckpt = os.path.join(save, "checkpoint_last.pt")
    gen_log = os.path.join(save, "generate.log")
    timing_path = os.path.join(save, "timing.json")
    os.makedirs(save, exist_ok=True)
    timing = {}
    if os.path.exists(timing_path):
        with open(timing_path) as f:
            timing = json.load(f)
    if not os.path.exists(ckpt) or args.retrain:
        started = time.time()
        run(["fairseq-train", bin_dir, "--user-dir", USER_DIR, "--arch", arch, *TINY,
             "--share-decoder-input-output-embed", "--optimizer", "adam", "--adam-betas", "(0.9,0.98)",
             "--lr", args.lr, "--lr-scheduler", "inverse_sqrt", "--warmup-updates", args.warmup,
             "--dropout", "0.1", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
             "--max-tokens", args.max_tokens, "--max-update", args.max_update, "--seed", args.seed,
             "--save-dir", save, "--no-epoch-checkpoints",
             "--log-format", "simple", "--log-interval", "50", "--no-progress-bar", "--cpu",
             "--num-workers", "0"], log_path=os.path.join(save, "train.log"))
        timing["train_seconds"] = round(time.time() - started, 1)
    if not (os.path.exists(gen_log) and os.path.getmtime(gen_log) > os.path.getmtime(ckpt)):
        started = time.time()
        run(["fairseq-generate", bin_dir, "--user-dir", USER_DIR, "--path", ckpt, "--gen-subset", "test",
             "--beam", "5", "--batch-size", "128", "--remove-bpe", "--cpu", "--max-len-a", "1.2",
             "--max-len-b", "10"], log_path=gen_log)
        timing["generate_seconds"] = round(time.time() - started, 1)
    with open(timing_path, "w") as f:
        json.dump(timing, f)
    with open(gen_log, encoding="utf-8") as f:
        match = re.search(r"BLEU4 = ([\d.]+)", f.read())
    if not match:
        fail(f"no BLEU in fairseq-generate output (see {gen_log})")
    return dict(model=name, arch=arch, bleu=float(match.group(1)), train_seconds=timing.get("train_seconds"),
                generate_seconds=timing.get("generate_seconds"))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", help="local Multi30k task1 raw files (default: download into --work-dir)")
    p.add_argument("--work-dir", default="work-dirs/demo_side_by_side", help="outputs (default: %(default)s)")
    p.add_argument("--max-train", type=int, default=0, help="use only the first N training pairs (0: all 29k)")
    p.add_argument("--max-eval", type=int, default=0,
                   help="use only the first N valid and test pairs (0: all 1,014 / 1,000)")
    p.add_argument("--bpe-merges", type=int, default=4000)
    p.add_argument("--max-update", type=int, default=500)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--lr", default="0.002")
    p.add_argument("--warmup", default="400")
    p.add_argument("--seed", default="1")
    p.add_argument("--retrain", action="store_true", help="train again even if checkpoints exist")
    args = p.parse_args(argv)

    started = time.time()
    data_dir = args.data_dir or download(os.path.join(args.work_dir, "raw"))
    if not os.path.isdir(data_dir):
        fail(f"--data-dir {data_dir} is not a folder")
    tokenise(data_dir, os.path.join(args.work_dir, "tok"), args.max_train, args.max_eval)
    learn_and_apply_bpe(os.path.join(args.work_dir, "tok"), os.path.join(args.work_dir, "bpe"), args.bpe_merges)
    bin_dir = os.path.join(args.work_dir, "data-bin")
    binarise(os.path.join(args.work_dir, "bpe"), bin_dir)
    results = [train_and_score(args, bin_dir, name, arch) for name, arch in MODELS]
    total = time.time() - started

    print("\n| model | --arch | test BLEU (beam 5) | train s | generate s |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r['model']} | {r['arch']} | {r['bleu']:.2f} | {r['train_seconds']} | {r['generate_seconds']} |")
    n_test = args.max_eval or "all"
    print(f"\nMulti30k De->En test_2016_flickr ({n_test} sentences), {args.max_update} updates each, "
          f"total {total:.0f} s")
    with open(os.path.join(args.work_dir, "results.json"), "w") as f:
        json.dump(dict(results=results, total_seconds=round(total, 1), args=vars(args)), f, indent=2)
    return results


if __name__ == "__main__":
    main()
