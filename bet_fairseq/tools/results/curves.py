"""Training / validation loss curves from fairseq-train logs (the paper's Figures 4 and 5).

Reads both ``--log-format json`` lines (``| train_inner | {"loss": ..., "num_updates": ...}``,
``| valid | {"valid_loss": ..., "valid_num_updates": ...}``) and ``--log-format simple`` lines
(``| train_inner | epoch 001: 10 / 57 loss=9.5, ..., num_updates=10`` and
``| valid | epoch 001 | valid on 'valid' subset | loss 9.2 | ... | num_updates 57``).
"""

import json
import re


_JSON = re.compile(r"\|\s*(train_inner|valid)\s*\|\s*(\{.*\})\s*$")
_SIMPLE_TRAIN = re.compile(r"\|\s*train_inner\s*\|.*?\bloss=([\d.]+).*?\bnum_updates=(\d+)")
_SIMPLE_VALID = re.compile(r"\|\s*valid\s*\|.*?\|\s*loss ([\d.]+)\s*\|.*?\|\s*num_updates (\d+)")
_SIMPLE_NLL = re.compile(r"\bnll_loss[= ]([\d.]+)")


def parse_log(path):
    """{"train": [(update, loss)], "valid": [(update, loss)], "train_nll": ..., "valid_nll": ...} of one
    fairseq-train log (base 2). ``*_nll``: the token loss (``nll_loss`` where the criterion logs it, as label
    smoothing and BET(SG)'s pointer loss do; else ``loss``, which is then the token loss)."""
    curves = {"train": [], "valid": [], "train_nll": [], "valid_nll": []}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = _JSON.search(line)
            if m:
                try:
                    stats = json.loads(m.group(2))
                except json.JSONDecodeError:
                    continue
                if m.group(1) == "train_inner" and "loss" in stats and "num_updates" in stats:
                    update = int(stats["num_updates"])
                    curves["train"].append((update, float(stats["loss"])))
                    curves["train_nll"].append((update, float(stats.get("nll_loss", stats["loss"]))))
                elif m.group(1) == "valid" and "valid_loss" in stats and "valid_num_updates" in stats:
                    update = int(stats["valid_num_updates"])
                    curves["valid"].append((update, float(stats["valid_loss"])))
                    curves["valid_nll"].append((update, float(stats.get("valid_nll_loss", stats["valid_loss"]))))
                continue
            for split, pattern in (("train", _SIMPLE_TRAIN), ("valid", _SIMPLE_VALID)):
                m = pattern.search(line)
                if m:
                    nll = _SIMPLE_NLL.search(line)
                    curves[split].append((int(m.group(2)), float(m.group(1))))
                    curves[f"{split}_nll"].append((int(m.group(2)), float(nll.group(1) if nll else m.group(1))))
                    break
    return curves


def _band(ax, curves, colour, label, linestyle="-"):
    """Mean over seeds of curves on their common updates, with the band of the seeds' minimum to maximum."""
    import numpy as np

    common = sorted(set.intersection(*[{u for u, _ in c} for c in curves])) if curves else []
    if not common:
        return
    values = np.array([[dict(c)[u] for u in common] for c in curves])
    ax.plot(common, values.mean(0), color=colour, label=label, linestyle=linestyle,
            marker="." if len(common) < 30 else None)
    if len(curves) > 1:
        ax.fill_between(common, values.min(0), values.max(0), color=colour, alpha=0.2, linewidth=0)


def plot_curves(groups, out_path, title, splits=("train", "valid"), quantity="loss (base 2)", count_seeds=False):
    """One PNG, a panel per split (keys of ``parse_log``'s result) against updates. ``groups``: [(label, [curves of
    its seeds, each ``parse_log``'s result], colour or None)]; each drawn as the mean over its seeds on their common
    updates with the seeds' range as a band (one seed: its own line); ``count_seeds`` adds the number to the label."""
    from ..figures import pyplot, save_png

    plt = pyplot()
    fig, axes = plt.subplots(1, len(splits), figsize=(5.8 * len(splits), 4.2), squeeze=False)
    palette = plt.get_cmap("tab20").colors
    for ax, split in zip(axes[0], splits):
        for k, (label, seeds, colour) in enumerate(groups):
            curves = [c[split] for c in seeds if c[split]]
            if count_seeds:
                label = f"{label} ({len(curves)} seed{'s' if len(curves) > 1 else ''})"
            _band(ax, curves, colour or palette[(2 * k) % 20 if k < 10 else (2 * k + 1) % 20], label,
                  "-" if colour or k < 10 else "--")
        ax.set_xlabel("updates")
        ax.set_ylabel(f"{'training' if split.startswith('train') else 'validation'} {quantity}")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_png(fig, out_path)
