"""A run's state as a JSON tree plus named numpy arrays, and back, without pickle.

``encode(obj)`` returns ``(tree, arrays)``: ``tree`` holds only JSON values (written with
``dumps_json``), every numpy array is replaced by a reference into ``arrays``
(``{"a0": ndarray, ...}``, written as an ``.npz`` and read with ``allow_pickle=False``).
``decode(tree, arrays)`` rebuilds the same objects: arrays bit for bit (dtype, shape,
memory order), the same Python types, dict insertion order, and shared references (two
attributes naming one Generator, list or array still name one object after a round trip).

What it handles: None, bool, int, float (nan/inf too), complex, str, bytes; list, tuple,
set, frozenset, dict (any hashable keys the codec handles), collections.deque (maxlen
kept), defaultdict (builtin factories), OrderedDict, Counter; numpy arrays and scalars of
any non-object, non-structured dtype; ``np.dtype``; ``np.random.Generator`` (its bit
generator class and state); instances of classes defined in ``clusterfed.`` modules that
keep their state in ``__dict__`` (dataclasses, frozen ones too, and plain classes).

Encoding anything else raises TypeError naming where it sits in the state
(``algorithm.tracker.foo``). Decoding never runs code named by the data: a class is
looked up by ``module:qualname`` only when the module's name starts with ``clusterfed.``,
it must be defined there (not imported from elsewhere), derive only from clusterfed
classes, and define none of ``__reduce__``/``__setstate__``/...; it is rebuilt with
``object.__new__`` and ``__dict__.update``, so no constructor, ``__init__``,
``__post_init__`` or ``__setstate__`` runs. Anything else raises DecodeError naming it.

Tree layout: JSON scalars and lists stand for themselves; a JSON object without a ``"$t"``
key is a dict with str keys stored in sorted order (the canonical writer sorts keys, so a
dict in any other order, or with other keys, is a tagged ``{"$t": "dict", "items":
[[key, value], ...]}`` that keeps its order). Every other type is an object with ``"$t"``
naming it. An object referenced more than once carries ``"id"`` where it is first written
and later references are ``{"$t": "ref", "id": n}``.

The work is split by direction: ``state_encoder`` walks a state into a tree,
``state_decoder`` rebuilds it, ``state_rules`` holds what both accept, and
``canonical_json`` writes and reads the tree's bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from clusterfed.runner.state_decoder import StateDecoder
from clusterfed.runner.state_encoder import StateEncoder
from clusterfed.runner.state_rules import DecodeError


def encode(obj: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """``(tree, arrays)`` for ``obj``: a JSON tree and the arrays it refers to by name.
    TypeError (naming the path) for a value of a type the codec does not handle."""
    encoder = StateEncoder()
    encoder.count(obj)
    tree = encoder.encode(obj, "")
    return tree, encoder.arrays


def decode(tree: Any, arrays: dict[str, np.ndarray]) -> Any:
    """The object ``encode`` was given, from its ``(tree, arrays)``. Every array in
    ``arrays`` must be referred to exactly once; DecodeError for anything the codec did not
    write (a foreign class, an unknown entry, a missing or unused array)."""
    decoder = StateDecoder(arrays)
    obj = decoder.decode(tree, "")
    unused = sorted(set(arrays) - decoder.used)
    if unused:
        raise DecodeError(f"arrays {', '.join(unused[:5])}{' ...' if len(unused) > 5 else ''} are not part of the state")
    return obj
