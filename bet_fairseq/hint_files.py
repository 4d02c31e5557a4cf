"""Where syntax-hint files live: shared by ``bet-syntax-hints``, which writes them, and the hint-aware
tasks, which read them. No fairseq import, so the preprocessor never loads (or patches) fairseq's
training code. The format is in ``tasks/syntax_hint_data.py``."""

import os


def hint_prefix(data_dir: str, split: str, lang: str = None) -> str:
    """The path (without .bin/.idx) of a split's hint file: ``{split}.hints.{lang}`` (translation,
    ``lang`` the target language) or ``{split}.hints`` (language modelling)."""
    name = f"{split}.hints.{lang}" if lang else f"{split}.hints"
    return os.path.join(data_dir, name)
