"""matplotlib for the PNGs of the analysis, the results tools and the study report: the Agg backend (no
display needed), imported only when a figure is drawn, and figures written atomically and always closed."""

from bet_fairseq.files import atomic_path


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend, with matplotlib's import-time logging quietened."""
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # before import: it logs at import time
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: str, dpi: int = 110, **savefig_kwargs) -> str:
    """Write ``fig`` to ``path`` under a temporary name, rename it when complete, and close it (also on error)."""
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=dpi, **savefig_kwargs)
    finally:
        pyplot().close(fig)
    return path
