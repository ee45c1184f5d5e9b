"""The checksum that binds each episode record to its run's fingerprint
(``jaxmesh.run.identity``): a record edited by hand or moved to another run's
file fails it (an accident, not a forger, who can recompute it)."""

from __future__ import annotations

import hashlib
import json


def identity_text(fingerprint: dict | None) -> str:
    """The part of a run's fingerprint a record's checksum covers, as text."""
    return json.dumps(fingerprint or {}, sort_keys=True, allow_nan=True)


def record_check(record: dict, identity: str) -> str:
    """The checksum of an ``EpisodeResult.to_dict()`` under ``identity_text``."""
    body = {k: v for k, v in record.items() if k != "check"}
    h = hashlib.blake2b(digest_size=16)
    h.update(identity.encode())
    h.update(json.dumps(body, sort_keys=True, allow_nan=True).encode())
    return h.hexdigest()
