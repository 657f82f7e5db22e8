"""Canonical JSON for checkpoints: the same tree always gives the same bytes, and reading
refuses what the writer never writes (a repeated key, a NaN/Infinity literal)."""

from __future__ import annotations

import json
from typing import Any


def dumps_json(tree: Any) -> bytes:
    """Canonical bytes of a JSON tree: sorted keys, no spaces, ASCII, no NaN/Infinity, so
    the same tree always gives the same bytes (and ``encode`` gives the same tree for the
    same state; sets are written in their iteration order, as pickle does)."""
    return json.dumps(tree, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def loads_json(data: bytes | str) -> Any:
    """A tree written by ``dumps_json``; ValueError for invalid JSON, a repeated key or a
    NaN/Infinity literal."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        result = dict(items)
        if len(result) != len(items):
            raise ValueError("a JSON object repeats a key")
        return result

    def constant(name: str) -> Any:
        raise ValueError(f"JSON literal {name} is not allowed")

    return json.loads(data, object_pairs_hook=pairs, parse_constant=constant)
