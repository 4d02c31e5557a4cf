"""Pictures of decoder self-attention: a heatmap per layer/head, and CA versus HA per layer.

matplotlib comes through ``bet_fairseq.tools.figures`` (the Agg backend, imported only when drawing).
"""

from typing import List, Optional, Sequence, Tuple

from ..figures import pyplot, save_png


def heatmap(matrix, tokens: Sequence[str], path: str, title: str = "", query_tokens: Optional[Sequence[str]] = None):
    """One ``(T, T)`` attention matrix: rows = queries (decoder inputs), columns = keys."""
    plt = pyplot()
    m = matrix.detach().cpu().float().numpy() if hasattr(matrix, "detach") else matrix
    n = m.shape[0]
    size = max(3.0, min(0.32 * n + 1.5, 24.0))
    fig, ax = plt.subplots(figsize=(size + 1.0, size))
    try:
        image = ax.imshow(m, cmap="viridis", vmin=0.0, vmax=max(float(m.max()), 1e-12), aspect="equal")
        ax.set_xticks(range(n))
        ax.set_yticks(range(n))
        ax.set_xticklabels(tokens, rotation=90, fontsize=7)
        ax.set_yticklabels(query_tokens or tokens, fontsize=7)
        ax.set_xlabel("key (attended token)")
        ax.set_ylabel("query (decoder input)")
        if title:
            ax.set_title(title, fontsize=9)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
        save_png(fig, path, dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)


def ca_ha_bars(series: List[Tuple[str, List[dict]]], path: str, title: str = ""):
    """Grouped bars per decoder layer: CA and HA(mean) (with HA(std) as an error bar) for each
    ``(label, layers)`` in ``series`` (``layers``: the per-layer dicts of a ``stats`` result)."""
    import numpy as np

    plt = pyplot()
    num_layers = max(len(layers) for _, layers in series)
    x = np.arange(1, num_layers + 1)
    groups = 2 * len(series)
    width = 0.8 / groups
    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * num_layers + 2), 3.6))
    try:
        colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for s, (label, layers) in enumerate(series):
            ca = [np.nan if (l is None) else l["CA"] for l in layers] + [np.nan] * (num_layers - len(layers))
            ha = [np.nan if (l is None) else l["HA_mean"] for l in layers] + [np.nan] * (num_layers - len(layers))
            sd = [0.0 if (l is None) else l["HA_std"] for l in layers] + [0.0] * (num_layers - len(layers))
            base = x - 0.4 + width * (2 * s) + width / 2
            colour = colours[s % len(colours)]
            ax.bar(base, ca, width, color=colour, label=f"{label}: CA")
            # Weights are >= 0: the lower bar stops at 0.
            lower = [min(d, h) if not np.isnan(h) else 0.0 for d, h in zip(sd, ha)]
            ax.bar(base + width, ha, width, yerr=[lower, sd], capsize=2, color=colour, alpha=0.45, hatch="//",
                   label=f"{label}: HA(mean) ± std")
        ax.set_xticks(x)
        ax.set_xlabel("decoder layer")
        ax.set_ylabel("attention weight")
        if title:
            ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        save_png(fig, path, dpi=120, bbox_inches="tight")
    finally:
        plt.close(fig)


def heatmap_grid(grid: List[List[Tuple[str, object]]], tokens: Sequence[str], path: str, title: str = ""):
    """Several ``(T, T)`` attention matrices of one sentence side by side: ``grid`` is rows of ``(title, matrix)``
    panels (e.g. one row per decoder layer, one column per model or pass), on one colour scale per panel."""
    plt = pyplot()
    rows, cols = len(grid), max(len(r) for r in grid)
    n = len(tokens)
    side = max(2.6, min(0.22 * n + 1.2, 6.0))
    fig, axes = plt.subplots(rows, cols, figsize=(side * cols + 0.6, side * rows + 0.6), squeeze=False)
    try:
        for i, row in enumerate(grid):
            for j in range(cols):
                ax = axes[i][j]
                if j >= len(row):
                    ax.axis("off")
                    continue
                name, matrix = row[j]
                m = matrix.detach().cpu().float().numpy() if hasattr(matrix, "detach") else matrix
                ax.imshow(m, cmap="viridis", vmin=0.0, vmax=1.0, aspect="equal")
                ax.set_xticks(range(n))
                ax.set_yticks(range(n))
                ax.set_xticklabels(tokens if i == rows - 1 else [], rotation=90, fontsize=6)
                ax.set_yticklabels(tokens if j == 0 else [], fontsize=6)
                ax.set_title(name, fontsize=8)
        if title:
            fig.suptitle(title, fontsize=9)
        fig.tight_layout()
        save_png(fig, path, dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)
