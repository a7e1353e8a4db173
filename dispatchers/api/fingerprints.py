"""Fingerprints of what the API changes, for the audit log (pure).

A resource's fingerprint is the SHA-256 of its canonical JSON (keys sorted, no
spaces) as the API shows it: its fields that are not secret (a signing secret
appears as its own fingerprint, credentials not at all). Two states with one
fingerprint are the same as far as anyone reading the API can tell; the log
never holds the values themselves.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def fingerprint(resource: Any) -> str | None:
    """The hex SHA-256 of ``resource``'s canonical JSON (a JSON-ready value, as
    the API's response models dump it), or None for no resource."""
    if resource is None:
        return None
    text = json.dumps(resource, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
