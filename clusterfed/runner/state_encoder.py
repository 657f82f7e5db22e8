"""The encoding direction of the checkpoint codec: a state walked into a JSON tree, its numpy
arrays set aside by reference, objects referenced more than once written once with an id
(the format is described in ``clusterfed.runner.state_codec``)."""

from __future__ import annotations

import collections
import math
from typing import Any

import numpy as np

from clusterfed.runner.state_rules import (BIT_GENERATORS, FACTORIES, TAG, class_problem, dtype_problem,
                                           join_path, own_module, where)

# types whose identity is kept (a second reference is written as a "ref")
_TRACKED = (list, dict, set, collections.deque, np.ndarray, np.random.Generator)


class StateEncoder:
    """Turns a state into a JSON tree, collecting its arrays in ``arrays``: ``count`` walks it
    once to find the objects referenced more than once, ``encode`` then writes the tree."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.seen: dict[int, int] = {}  # id -> references, for tracked objects
        self.anchors: dict[int, int] = {}  # id -> anchor number, once written

    @staticmethod
    def tracked(obj: Any) -> bool:
        return isinstance(obj, _TRACKED) or (hasattr(obj, "__dict__") and not isinstance(obj, type)
                                             and own_module(type(obj).__module__))

    def count(self, obj: Any) -> None:
        """First pass: how often each tracked object is referenced."""
        stack = [obj]
        while stack:
            item = stack.pop()
            if self.tracked(item):
                n = self.seen.get(id(item), 0)
                self.seen[id(item)] = n + 1
                if n:
                    continue
            if isinstance(item, (str, bytes, np.ndarray, np.generic)):
                continue
            if isinstance(item, dict):
                stack.extend(item.keys())
                stack.extend(item.values())
            elif isinstance(item, (list, tuple, set, frozenset, collections.deque)):
                stack.extend(item)
            elif self.tracked(item) and not isinstance(item, np.random.Generator):
                stack.extend(vars(item).values())

    def encode(self, obj: Any, path: str) -> Any:
        kind = type(obj)
        if obj is None or kind is bool or kind is str or kind is int:
            return obj
        if kind is float:
            return obj if math.isfinite(obj) else {TAG: "float", "value": repr(obj)}
        if kind is complex:
            return {TAG: "complex", "real": self.encode(obj.real, path), "imag": self.encode(obj.imag, path)}
        if kind is bytes:
            return {TAG: "bytes", "hex": obj.hex()}
        if kind is tuple or kind is frozenset:
            return {TAG: kind.__name__, "items": [self.encode(v, f"{path}[{i}]") for i, v in enumerate(obj)]}
        if isinstance(obj, np.generic) and kind.__module__ == "numpy":
            problem = dtype_problem(obj.dtype)
            if problem:
                raise TypeError(f"cannot save {where(path)}: a numpy scalar of {problem}")
            return {TAG: "scalar", "dtype": obj.dtype.str, "hex": obj.tobytes().hex()}
        if isinstance(obj, np.dtype):
            problem = dtype_problem(obj)
            if problem:
                raise TypeError(f"cannot save {where(path)}: a numpy {problem}")
            return {TAG: "dtype", "descr": obj.str}
        if id(obj) in self.anchors:
            return {TAG: "ref", "id": self.anchors[id(obj)]}
        node = self.encode_tracked(obj, kind, path)
        return node

    def anchor(self, obj: Any, node: dict[str, Any]) -> dict[str, Any]:
        """Give ``node`` an id when ``obj`` is referenced more than once (before its
        children are written, so a reference back to it from inside resolves)."""
        if self.seen.get(id(obj), 0) > 1:
            node["id"] = self.anchors[id(obj)] = len(self.anchors)
        return node

    def items(self, mapping: dict, path: str) -> list[list[Any]]:
        return [[self.encode(k, f"{path}[key {k!r}]"), self.encode(v, join_path(path, k))] for k, v in mapping.items()]

    def encode_tracked(self, obj: Any, kind: type, path: str) -> Any:
        shared = self.seen.get(id(obj), 0) > 1
        if kind is list:
            if not shared:
                return [self.encode(v, f"{path}[{i}]") for i, v in enumerate(obj)]
            node = self.anchor(obj, {TAG: "list"})
            node["items"] = [self.encode(v, f"{path}[{i}]") for i, v in enumerate(obj)]
            return node
        if kind is dict:
            keys = list(obj)
            if not shared and all(type(k) is str and not k.startswith("$") for k in keys) and keys == sorted(keys):
                return {k: self.encode(v, join_path(path, k)) for k, v in obj.items()}
            node = self.anchor(obj, {TAG: "dict"})
            node["items"] = self.items(obj, path)
            return node
        if kind is collections.OrderedDict or kind is collections.Counter:
            node = self.anchor(obj, {TAG: kind.__name__})
            node["items"] = self.items(obj, path)
            return node
        if kind is collections.defaultdict:
            factory = obj.default_factory
            if factory is not None and FACTORIES.get(getattr(factory, "__name__", None)) is not factory:
                raise TypeError(f"cannot save {where(path)}: a defaultdict whose default_factory is "
                                f"{factory!r} (allowed: None or one of {', '.join(sorted(FACTORIES))})")
            node = self.anchor(obj, {TAG: "defaultdict", "factory": None if factory is None else factory.__name__})
            node["items"] = self.items(obj, path)
            return node
        if kind is set:
            node = self.anchor(obj, {TAG: "set"})
            node["items"] = [self.encode(v, f"{path}[{i}]") for i, v in enumerate(obj)]
            return node
        if kind is collections.deque:
            node = self.anchor(obj, {TAG: "deque", "maxlen": obj.maxlen})
            node["items"] = [self.encode(v, f"{path}[{i}]") for i, v in enumerate(obj)]
            return node
        if kind is np.ndarray:
            problem = dtype_problem(obj.dtype)
            if problem:
                raise TypeError(f"cannot save {where(path)}: an array of {problem}")
            ref = f"a{len(self.arrays)}"
            self.arrays[ref] = obj
            return self.anchor(obj, {TAG: "ndarray", "ref": ref, "dtype": obj.dtype.str, "shape": list(obj.shape)})
        if kind is np.random.Generator:
            bit_generator = obj.bit_generator
            name = type(bit_generator).__name__
            if name not in BIT_GENERATORS or getattr(np.random, name) is not type(bit_generator):
                raise TypeError(f"cannot save {where(path)}: a Generator over {type(bit_generator)!r} "
                                f"(allowed: {', '.join(BIT_GENERATORS)})")
            node = self.anchor(obj, {TAG: "generator", "bit_generator": name})
            node["state"] = self.encode(bit_generator.state, f"{path}.bit_generator.state")
            return node
        if hasattr(obj, "__dict__") and not isinstance(obj, type) and own_module(kind.__module__):
            problem = class_problem(kind)
            if problem:
                raise TypeError(f"cannot save {where(path)}: {problem}; its state would not be its __dict__")
            node = self.anchor(obj, {TAG: "object", "class": f"{kind.__module__}:{kind.__qualname__}"})
            fields = vars(obj)
            if any(type(k) is not str for k in fields):
                raise TypeError(f"cannot save {where(path)}: an attribute name is not a str")
            node["fields"] = self.items(fields, path)
            return node
        raise TypeError(f"cannot save {where(path)}: {kind.__module__}.{kind.__qualname__} is not a type the "
                        "checkpoint codec handles (see clusterfed.runner.state_codec); store plain data there "
                        "or a clusterfed dataclass")
