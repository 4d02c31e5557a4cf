"""Completion markers: the one way this project says "this step finished, with these inputs and settings".

A marker is a small JSON record written atomically (``bet_fairseq.files.atomic_write``) when a step has finished.
It holds the step's ``settings`` (everything that determines its result: commands, seeds, data, input files) and
a SHA-256 ``digest`` of its own content, so a marker that was cut short or edited by hand is told apart from a
whole one. ``read`` returns the record only when the file parses, the digest matches and the settings are the
ones asked for; otherwise it says why (naming the file) and returns None, so the caller redoes the step instead of
trusting a damaged or stale marker.

Its users: data preparation and the study's data (``Steps``: one marker per step under ``ROOT/.done``), the
syntax-hint preprocessor (the settings of a partial parse, for ``--resume``), the study's runs
(``tools/study/store.py``), the side-by-side demo and ``bet-run-row`` (``result.json``).

Nothing here imports fairseq.
"""

import hashlib
import json
import os
import sys
from typing import Callable, Iterable, List, Optional

from bet_fairseq.files import atomic_write

DIGEST = "digest"


def _digest(record: dict) -> str:
    body = {k: v for k, v in record.items() if k != DIGEST}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode("utf-8")).hexdigest()


def write(path: str, record: dict, settings: Optional[dict] = None) -> dict:
    """Write ``record`` (plus ``settings`` and the digest) to ``path`` atomically; returns what was written."""
    record = dict(record)
    if settings is not None:
        record["settings"] = settings
    record[DIGEST] = _digest(record)
    with atomic_write(path) as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    return record


def _load(path: str):
    """(record, why it cannot be read or None)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f), None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"{path} is damaged ({exc})"


def _other_settings(path: str, made: Optional[dict], now: dict) -> Optional[str]:
    made = made if isinstance(made, dict) else {}
    if made == json.loads(json.dumps(now)):  # compared as written: tuples are lists once in JSON
        return None
    changed = sorted(k for k in set(now) | set(made) if json.loads(json.dumps(now.get(k))) != made.get(k))
    return f"{path} was made with other settings ({', '.join(changed) or 'settings'} changed)"


def problem(path: str, settings: Optional[dict] = None) -> Optional[str]:
    """Why the marker at ``path`` cannot be trusted, in one line naming the file (None when it can, or when there
    is none): damaged (not JSON, or its content does not match its digest: cut short or edited by hand), or made
    with other ``settings``."""
    if not os.path.exists(path):
        return None
    record, why = _load(path)
    if why is not None:
        return why
    if not isinstance(record, dict) or record.get(DIGEST) != _digest(record):
        return f"{path} is damaged (its content does not match its digest: cut short or edited by hand)"
    return None if settings is None else _other_settings(path, record.get("settings"), settings)


def read(path: str, settings: Optional[dict] = None, say: Callable[[str], None] = print) -> Optional[dict]:
    """The marker's record when it exists and can be trusted; else None, after ``say``-ing why (when it exists)."""
    why = problem(path, settings)
    if why is not None:
        say(f"{why}: redoing the step")
        return None
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


# ----------------------------------------------------------------------------- input files


def file_digest(path: str, algorithm: str = "sha256") -> str:
    """Hex digest of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def inputs_signature(paths: Iterable[str], digests: bool = True) -> List[list]:
    """[path, size, mtime(, SHA-256)] of each input file: what a step's marker records of its inputs."""
    sig = []
    for p in paths:
        st = os.stat(p)
        sig.append([os.path.abspath(p), st.st_size, int(st.st_mtime)] + ([file_digest(p)] if digests else []))
    return sig


def same_inputs(recorded, paths: List[str]) -> bool:
    """Each input has the recorded path and size, and either the recorded mtime or the recorded digest (a copied
    or restored folder, or an earlier step redone to the same bytes, still matches)."""
    if not isinstance(recorded, list) or len(recorded) != len(paths):
        return False
    for entry, now in zip(recorded, inputs_signature(paths, digests=False)):
        if not isinstance(entry, list) or len(entry) not in (3, 4) or entry[:2] != now[:2]:
            return False
        # a marker written before digests were recorded (3 entries) matches on the mtime only
        if entry[2] != now[2] and (len(entry) == 3 or entry[3] != file_digest(now[0])):
            return False
    return True


# ----------------------------------------------------------------------------- steps of a folder


def _log(message):
    print(message, file=sys.stderr, flush=True)


LEGACY_STEP = {"inputs", "outputs", "settings"}  # a step marker of version 0.3 and before: no digest


class Steps:
    """Resumable steps under ``root``: ``run(name, inputs, outputs, fn, settings)`` runs ``fn`` unless the step's
    marker (``ROOT/.done/NAME.done``) is whole and records these outputs, these settings and these inputs (by
    ``same_inputs``). ``force``: every step runs again. A damaged or hand-edited marker is named and its step redone.
    Markers written before markers had a digest still count while they match."""

    def __init__(self, root: str, force: bool = False, say: Callable[[str], None] = _log):
        self.root, self.force, self.say = root, force, say
        self.marker_dir = os.path.join(root, ".done")
        os.makedirs(self.marker_dir, exist_ok=True)

    def marker(self, name: str) -> str:
        return os.path.join(self.marker_dir, f"{name}.done")

    def why_not_done(self, name, inputs, outputs, settings=None) -> Optional[str]:
        """Why the step must run (None when it is done): no marker, a missing output, a damaged marker, other
        settings, outputs or inputs."""
        marker = self.marker(name)
        if self.force:
            return "--force"
        if not os.path.exists(marker):
            return "no marker"
        missing = [p for p in outputs if not os.path.exists(p)]
        if missing:
            return f"{missing[0]} is missing"
        record, why = _load(marker)
        if why is None and not (isinstance(record, dict) and set(record) == LEGACY_STEP):
            why = problem(marker, settings or {})
        elif why is None:
            why = _other_settings(marker, record.get("settings"), settings or {})
        if why is not None:
            return why
        if record.get("outputs") != [os.path.abspath(p) for p in outputs]:
            return f"{marker} was made for other outputs"
        if not same_inputs(record.get("inputs"), inputs):
            return f"{marker} was made from other inputs"
        return None

    def is_done(self, name, inputs, outputs, settings=None) -> bool:
        return self.why_not_done(name, inputs, outputs, settings) is None

    def run(self, name, inputs, outputs, fn, settings=None) -> bool:
        """Run ``fn()`` unless an identical earlier run finished; ``fn`` must write ``outputs``. Returns whether it
        ran."""
        why = self.why_not_done(name, inputs, outputs, settings)
        if why is None:
            self.say(f"[{name}] skipping: already done ({', '.join(os.path.basename(p) for p in outputs[:4])}"
                     f"{' ...' if len(outputs) > 4 else ''})")
            return False
        marker = self.marker(name)
        if os.path.exists(marker):
            if "damaged" in why:
                self.say(f"[{name}] {why}: running it again")
            os.remove(marker)
        self.say(f"[{name}] running")
        fn()
        missing = [p for p in outputs if not os.path.exists(p)]
        if missing:
            raise RuntimeError(f"step {name} did not write {missing}")
        write(marker, {"inputs": inputs_signature(inputs), "outputs": [os.path.abspath(p) for p in outputs]},
              settings or {})
        return True
