"""Completion markers: small JSON records that say a step finished, with what settings, and that they are whole.

A marker holds the step's ``settings`` (everything that determines its result: commands, seeds, data) and a
SHA-256 ``digest`` of its own content. ``read`` returns the record only when the file parses, the digest
matches and the settings are the ones asked for; otherwise it says why (naming the file) and returns None,
so the caller redoes the step instead of trusting a damaged or stale marker. Written atomically.
"""

import hashlib
import json
import os
from typing import Callable, Optional

from bet_fairseq.files import atomic_write


def _digest(record: dict) -> str:
    body = {k: v for k, v in record.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode("utf-8")).hexdigest()


def write(path: str, record: dict, settings: Optional[dict] = None) -> dict:
    """Write ``record`` (plus ``settings`` and the digest) to ``path`` atomically; returns what was written."""
    record = dict(record)
    if settings is not None:
        record["settings"] = settings
    record["digest"] = _digest(record)
    with atomic_write(path) as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    return record


def problem(path: str, settings: Optional[dict] = None) -> Optional[str]:
    """Why the marker at ``path`` cannot be trusted (None when it can, or when there is none)."""
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"{path} is damaged ({exc})"
    if not isinstance(record, dict) or record.get("digest") != _digest(record):
        return f"{path} is damaged (its content does not match its digest)"
    if settings is not None and record.get("settings") != settings:
        changed = sorted(k for k in set(settings) | set(record.get("settings") or {})
                         if settings.get(k) != (record.get("settings") or {}).get(k))
        return f"{path} was made with other settings ({', '.join(changed) or 'settings'} changed)"
    return None


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
