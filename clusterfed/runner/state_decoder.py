"""The decoding direction of the checkpoint codec: a JSON tree and its arrays back into
objects, refusing anything the encoder does not write and never running code the data names
(the format is described in ``clusterfed.runner.state_codec``)."""

from __future__ import annotations

import collections
import importlib
from typing import Any

import numpy as np

from clusterfed.runner.state_rules import (BIT_GENERATORS, FACTORIES, TAG, DecodeError, class_problem,
                                           dtype_problem, join_path, own_module, where)


def _fields(node: dict[str, Any], path: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    keys = set(node) - {TAG}
    missing = set(required) - keys
    extra = keys - set(required) - set(optional) - {"id"}
    if missing or extra:
        raise DecodeError(f"entry {node[TAG]!r} at {where(path)} has keys {sorted(keys)}; "
                          f"expected {sorted(required)}")


def _dtype(descr: Any, path: str) -> np.dtype:
    if type(descr) is not str or len(descr) > 64:
        raise DecodeError(f"dtype at {where(path)} is not a dtype string")
    try:
        dtype = np.dtype(descr)
    except (TypeError, ValueError) as error:
        raise DecodeError(f"dtype {descr!r} at {where(path)}: {error}") from None
    problem = dtype_problem(dtype)
    if problem or dtype.str != descr:
        raise DecodeError(f"dtype {descr!r} at {where(path)} is refused ({problem or 'not canonical'})")
    return dtype


# modules whose classes moved since a checkpoint may have been written (it names each class
# where it was defined then): the shared vocabulary went from strategies/ to core/
MOVED_MODULES = {f"clusterfed.strategies.{name}": f"clusterfed.core.{name}"
                 for name in ("exchange", "contract", "params", "aggregation", "flower_hooks")}


def _resolve_class(name: Any, path: str) -> type:
    """The clusterfed class ``module:qualname``; the module is imported only when its name
    is a clusterfed module's."""
    if type(name) is not str or name.count(":") != 1:
        raise DecodeError(f"class name at {where(path)} is not 'module:qualname'")
    module_name, qualname = name.split(":")
    if not own_module(module_name):
        raise DecodeError(f"refusing class {name!r} at {where(path)}: only classes defined in clusterfed "
                          "modules are restored")
    parts = qualname.split(".")
    if not all(p.isidentifier() for p in module_name.split(".")) or not all(p.isidentifier() for p in parts):
        raise DecodeError(f"refusing class {name!r} at {where(path)}: not a module:qualname")
    module_name = MOVED_MODULES.get(module_name, module_name)
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - a missing module, or one failing to import
        raise DecodeError(f"refusing class {name!r} at {where(path)}: its module cannot be imported "
                          f"({type(error).__name__}: {error})") from None
    for part in parts:
        target = vars(target).get(part) if hasattr(target, "__dict__") else None
    if not isinstance(target, type) or target.__module__ != module_name or target.__qualname__ != qualname:
        raise DecodeError(f"refusing class {name!r} at {where(path)}: no such class is defined there")
    problem = class_problem(target)
    if problem:
        raise DecodeError(f"refusing class {name!r} at {where(path)}: {problem}")
    return target


class StateDecoder:
    """Rebuilds objects from a JSON tree and the arrays it refers to, one ``tag_*`` method
    per entry type; ``used`` collects the arrays referred to."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays
        self.used: set[str] = set()
        self.anchors: dict[int, Any] = {}

    def register(self, node: dict[str, Any], obj: Any, path: str) -> Any:
        if "id" in node:
            number = node["id"]
            if type(number) is not int or number in self.anchors:
                raise DecodeError(f"entry at {where(path)} has a bad or repeated id {number!r}")
            self.anchors[number] = obj
        return obj

    def decode(self, node: Any, path: str) -> Any:
        kind = type(node)
        if node is None or kind in (bool, str, int, float):
            return node
        if kind is list:
            return [self.decode(v, f"{path}[{i}]") for i, v in enumerate(node)]
        if kind is not dict:
            raise DecodeError(f"unexpected {kind.__name__} at {where(path)}")
        if TAG not in node:
            bad = [k for k in node if k.startswith("$")]
            if bad:
                raise DecodeError(f"unexpected key {bad[0]!r} at {where(path)}")
            return {k: self.decode(v, join_path(path, k)) for k, v in node.items()}
        tag = node[TAG]
        handler = getattr(self, f"tag_{tag}", None) if type(tag) is str and tag.isidentifier() else None
        if handler is None:
            raise DecodeError(f"unknown entry {tag!r} at {where(path)}")
        return handler(node, path)

    def decode_items(self, node: dict[str, Any], path: str) -> list[Any]:
        items = node["items"]
        if type(items) is not list:
            raise DecodeError(f"items of {node[TAG]!r} at {where(path)} are not a list")
        return items

    def fill_pairs(self, target: Any, node: dict[str, Any], path: str) -> Any:
        for i, pair in enumerate(self.decode_items(node, path)):
            if type(pair) is not list or len(pair) != 2:
                raise DecodeError(f"item {i} of {node[TAG]!r} at {where(path)} is not a [key, value] pair")
            key = self.decode(pair[0], f"{path}[key {i}]")
            try:
                target[key] = self.decode(pair[1], join_path(path, key))
            except TypeError as error:  # an unhashable key
                raise DecodeError(f"key {i} at {where(path)}: {error}") from None
        return target

    # one method per tag
    def tag_float(self, node, path):
        _fields(node, path, ("value",))
        if node["value"] not in ("nan", "inf", "-inf"):
            raise DecodeError(f"float {node['value']!r} at {where(path)} is not nan, inf or -inf")
        return float(node["value"])

    def tag_complex(self, node, path):
        _fields(node, path, ("real", "imag"))
        real, imag = self.decode(node["real"], path), self.decode(node["imag"], path)
        if type(real) is not float or type(imag) is not float:
            raise DecodeError(f"complex at {where(path)} has non-float parts")
        return complex(real, imag)

    def tag_bytes(self, node, path):
        _fields(node, path, ("hex",))
        try:
            return bytes.fromhex(node["hex"])
        except (TypeError, ValueError):
            raise DecodeError(f"bytes at {where(path)} are not hex") from None

    def tag_tuple(self, node, path):
        _fields(node, path, ("items",))
        return tuple(self.decode(v, f"{path}[{i}]") for i, v in enumerate(self.decode_items(node, path)))

    def tag_frozenset(self, node, path):
        _fields(node, path, ("items",))
        try:
            return frozenset(self.decode(v, f"{path}[{i}]") for i, v in enumerate(self.decode_items(node, path)))
        except TypeError as error:
            raise DecodeError(f"frozenset at {where(path)}: {error}") from None

    def tag_set(self, node, path):
        _fields(node, path, ("items",))
        result = self.register(node, set(), path)
        for i, value in enumerate(self.decode_items(node, path)):
            try:
                result.add(self.decode(value, f"{path}[{i}]"))
            except TypeError as error:
                raise DecodeError(f"set at {where(path)}: {error}") from None
        return result

    def tag_list(self, node, path):
        _fields(node, path, ("items",))
        result = self.register(node, [], path)
        result.extend(self.decode(v, f"{path}[{i}]") for i, v in enumerate(self.decode_items(node, path)))
        return result

    def tag_dict(self, node, path):
        _fields(node, path, ("items",))
        return self.fill_pairs(self.register(node, {}, path), node, path)

    def tag_OrderedDict(self, node, path):
        _fields(node, path, ("items",))
        return self.fill_pairs(self.register(node, collections.OrderedDict(), path), node, path)

    def tag_Counter(self, node, path):
        _fields(node, path, ("items",))
        return self.fill_pairs(self.register(node, collections.Counter(), path), node, path)

    def tag_defaultdict(self, node, path):
        _fields(node, path, ("factory", "items"))
        name = node["factory"]
        if name is not None and (type(name) is not str or name not in FACTORIES):
            raise DecodeError(f"defaultdict factory {name!r} at {where(path)} is refused")
        result = collections.defaultdict(None if name is None else FACTORIES[name])
        return self.fill_pairs(self.register(node, result, path), node, path)

    def tag_deque(self, node, path):
        _fields(node, path, ("maxlen", "items"))
        maxlen = node["maxlen"]
        if maxlen is not None and (type(maxlen) is not int or maxlen < 0):
            raise DecodeError(f"deque maxlen {maxlen!r} at {where(path)}")
        result = self.register(node, collections.deque(maxlen=maxlen), path)
        result.extend(self.decode(v, f"{path}[{i}]") for i, v in enumerate(self.decode_items(node, path)))
        return result

    def tag_ref(self, node, path):
        _fields(node, path, ("id",))
        if type(node["id"]) is not int or node["id"] not in self.anchors:
            raise DecodeError(f"reference at {where(path)} names no earlier entry")
        return self.anchors[node["id"]]

    def tag_scalar(self, node, path):
        _fields(node, path, ("dtype", "hex"))
        dtype = _dtype(node["dtype"], path)
        try:
            data = bytes.fromhex(node["hex"])
        except (TypeError, ValueError):
            raise DecodeError(f"scalar at {where(path)} is not hex") from None
        if len(data) != dtype.itemsize:
            raise DecodeError(f"scalar at {where(path)} has {len(data)} bytes, {dtype} needs {dtype.itemsize}")
        return np.frombuffer(data, dtype=dtype)[0]

    def tag_dtype(self, node, path):
        _fields(node, path, ("descr",))
        return _dtype(node["descr"], path)

    def tag_ndarray(self, node, path):
        _fields(node, path, ("ref", "dtype", "shape"))
        ref = node["ref"]
        if type(ref) is not str or ref not in self.arrays:
            raise DecodeError(f"array {ref!r} at {where(path)} is not in the array file")
        if ref in self.used:
            raise DecodeError(f"array {ref!r} is referred to twice (at {where(path)})")
        self.used.add(ref)
        array = self.arrays[ref]
        if type(array) is not np.ndarray or array.dtype.str != node["dtype"] or list(array.shape) != node["shape"]:
            raise DecodeError(f"array {ref!r} at {where(path)} is {getattr(array, 'dtype', '?')} "
                              f"{getattr(array, 'shape', '?')}, the state says {node['dtype']} {node['shape']}")
        return self.register(node, array, path)

    def tag_generator(self, node, path):
        _fields(node, path, ("bit_generator", "state"))
        name = node["bit_generator"]
        if name not in BIT_GENERATORS:
            raise DecodeError(f"bit generator {name!r} at {where(path)} is refused")
        bit_generator = getattr(np.random, name)(0)
        generator = self.register(node, np.random.Generator(bit_generator), path)
        state = self.decode(node["state"], f"{path}.bit_generator.state")
        try:
            bit_generator.state = state
        except (TypeError, ValueError, KeyError) as error:
            raise DecodeError(f"state of the {name} generator at {where(path)}: {error}") from None
        return generator

    def tag_object(self, node, path):
        _fields(node, path, ("class", "fields"))
        cls = _resolve_class(node["class"], path)
        obj = self.register(node, object.__new__(cls), path)
        fields = self.fill_pairs({}, {TAG: "object", "items": node["fields"]}, path)
        if any(type(k) is not str for k in fields):
            raise DecodeError(f"{node['class']} at {where(path)} has a non-str attribute name")
        obj.__dict__.update(fields)
        return obj
