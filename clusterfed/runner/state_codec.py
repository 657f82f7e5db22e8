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
"""

from __future__ import annotations

import collections
import importlib
import json
import math
from typing import Any

import numpy as np

TAG = "$t"
_OWN = "clusterfed"
# defaultdict factories that may be saved (by name) and restored
_FACTORIES = {f.__name__: f for f in (list, dict, set, frozenset, tuple, int, float, str, bool)}
# bit generators a Generator may use (their state is plain ints, strings and uint arrays)
_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")
# what a class must not define for its __dict__ to be its whole state
_CUSTOM_STATE = ("__reduce__", "__reduce_ex__", "__getstate__", "__setstate__", "__getnewargs__",
                 "__getnewargs_ex__", "__slots__")
# types whose identity is kept (a second reference is written as a "ref")
_TRACKED = (list, dict, set, collections.deque, np.ndarray, np.random.Generator)


class DecodeError(ValueError):
    """A tree this codec will not turn back into objects (foreign class, malformed entry)."""


# ---------------------------------------------------------------------- canonical JSON
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


# ---------------------------------------------------------------------- shared helpers
def _own_module(name: str) -> bool:
    return name == _OWN or name.startswith(_OWN + ".")


def _class_problem(cls: type) -> str | None:
    """Why instances of ``cls`` cannot be saved as their ``__dict__`` (None: they can)."""
    if not _own_module(cls.__module__):
        return f"{cls.__module__}.{cls.__qualname__} is not a clusterfed class"
    if "<locals>" in cls.__qualname__:
        return f"{cls.__module__}.{cls.__qualname__} is defined inside a function"
    for base in cls.__mro__:
        if base is object:
            continue
        if not _own_module(base.__module__):
            return f"{cls.__qualname__} derives from {base.__module__}.{base.__qualname__}"
        for name in _CUSTOM_STATE:
            if name in vars(base):
                return f"{base.__qualname__} defines {name}"
    return None


def _dtype_problem(dtype: np.dtype) -> str | None:
    if dtype.hasobject:
        return "object dtype"
    if dtype.fields is not None or dtype.subdtype is not None:
        return f"structured dtype {dtype}"
    return None


def _join(path: str, key: Any) -> str:
    if isinstance(key, str) and key.isidentifier():
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def _where(path: str) -> str:
    return path or "the state"


# ---------------------------------------------------------------------- encode
def encode(obj: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """``(tree, arrays)`` for ``obj``: a JSON tree and the arrays it refers to by name.
    TypeError (naming the path) for a value of a type the codec does not handle."""
    encoder = _Encoder()
    encoder.count(obj)
    tree = encoder.encode(obj, "")
    return tree, encoder.arrays


class _Encoder:
    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.seen: dict[int, int] = {}  # id -> references, for tracked objects
        self.anchors: dict[int, int] = {}  # id -> anchor number, once written

    @staticmethod
    def tracked(obj: Any) -> bool:
        return isinstance(obj, _TRACKED) or (hasattr(obj, "__dict__") and not isinstance(obj, type)
                                             and _own_module(type(obj).__module__))

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
            problem = _dtype_problem(obj.dtype)
            if problem:
                raise TypeError(f"cannot save {_where(path)}: a numpy scalar of {problem}")
            return {TAG: "scalar", "dtype": obj.dtype.str, "hex": obj.tobytes().hex()}
        if isinstance(obj, np.dtype):
            problem = _dtype_problem(obj)
            if problem:
                raise TypeError(f"cannot save {_where(path)}: a numpy {problem}")
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
        return [[self.encode(k, f"{path}[key {k!r}]"), self.encode(v, _join(path, k))] for k, v in mapping.items()]

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
                return {k: self.encode(v, _join(path, k)) for k, v in obj.items()}
            node = self.anchor(obj, {TAG: "dict"})
            node["items"] = self.items(obj, path)
            return node
        if kind is collections.OrderedDict or kind is collections.Counter:
            node = self.anchor(obj, {TAG: kind.__name__})
            node["items"] = self.items(obj, path)
            return node
        if kind is collections.defaultdict:
            factory = obj.default_factory
            if factory is not None and _FACTORIES.get(getattr(factory, "__name__", None)) is not factory:
                raise TypeError(f"cannot save {_where(path)}: a defaultdict whose default_factory is "
                                f"{factory!r} (allowed: None or one of {', '.join(sorted(_FACTORIES))})")
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
            problem = _dtype_problem(obj.dtype)
            if problem:
                raise TypeError(f"cannot save {_where(path)}: an array of {problem}")
            ref = f"a{len(self.arrays)}"
            self.arrays[ref] = obj
            return self.anchor(obj, {TAG: "ndarray", "ref": ref, "dtype": obj.dtype.str, "shape": list(obj.shape)})
        if kind is np.random.Generator:
            bit_generator = obj.bit_generator
            name = type(bit_generator).__name__
            if name not in _BIT_GENERATORS or getattr(np.random, name) is not type(bit_generator):
                raise TypeError(f"cannot save {_where(path)}: a Generator over {type(bit_generator)!r} "
                                f"(allowed: {', '.join(_BIT_GENERATORS)})")
            node = self.anchor(obj, {TAG: "generator", "bit_generator": name})
            node["state"] = self.encode(bit_generator.state, f"{path}.bit_generator.state")
            return node
        if hasattr(obj, "__dict__") and not isinstance(obj, type) and _own_module(kind.__module__):
            problem = _class_problem(kind)
            if problem:
                raise TypeError(f"cannot save {_where(path)}: {problem}; its state would not be its __dict__")
            node = self.anchor(obj, {TAG: "object", "class": f"{kind.__module__}:{kind.__qualname__}"})
            fields = vars(obj)
            if any(type(k) is not str for k in fields):
                raise TypeError(f"cannot save {_where(path)}: an attribute name is not a str")
            node["fields"] = self.items(fields, path)
            return node
        raise TypeError(f"cannot save {_where(path)}: {kind.__module__}.{kind.__qualname__} is not a type the "
                        "checkpoint codec handles (see clusterfed.runner.state_codec); store plain data there "
                        "or a clusterfed dataclass")


# ---------------------------------------------------------------------- decode
def decode(tree: Any, arrays: dict[str, np.ndarray]) -> Any:
    """The object ``encode`` was given, from its ``(tree, arrays)``. Every array in
    ``arrays`` must be referred to exactly once; DecodeError for anything the codec did not
    write (a foreign class, an unknown entry, a missing or unused array)."""
    decoder = _Decoder(arrays)
    obj = decoder.decode(tree, "")
    unused = sorted(set(arrays) - decoder.used)
    if unused:
        raise DecodeError(f"arrays {', '.join(unused[:5])}{' ...' if len(unused) > 5 else ''} are not part of the state")
    return obj


def _fields(node: dict[str, Any], path: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    keys = set(node) - {TAG}
    missing = set(required) - keys
    extra = keys - set(required) - set(optional) - {"id"}
    if missing or extra:
        raise DecodeError(f"entry {node[TAG]!r} at {_where(path)} has keys {sorted(keys)}; "
                          f"expected {sorted(required)}")


def _dtype(descr: Any, path: str) -> np.dtype:
    if type(descr) is not str or len(descr) > 64:
        raise DecodeError(f"dtype at {_where(path)} is not a dtype string")
    try:
        dtype = np.dtype(descr)
    except (TypeError, ValueError) as error:
        raise DecodeError(f"dtype {descr!r} at {_where(path)}: {error}") from None
    problem = _dtype_problem(dtype)
    if problem or dtype.str != descr:
        raise DecodeError(f"dtype {descr!r} at {_where(path)} is refused ({problem or 'not canonical'})")
    return dtype


def _resolve_class(name: Any, path: str) -> type:
    """The clusterfed class ``module:qualname``; the module is imported only when its name
    is a clusterfed module's."""
    if type(name) is not str or name.count(":") != 1:
        raise DecodeError(f"class name at {_where(path)} is not 'module:qualname'")
    module_name, qualname = name.split(":")
    if not _own_module(module_name):
        raise DecodeError(f"refusing class {name!r} at {_where(path)}: only classes defined in clusterfed "
                          "modules are restored")
    parts = qualname.split(".")
    if not all(p.isidentifier() for p in module_name.split(".")) or not all(p.isidentifier() for p in parts):
        raise DecodeError(f"refusing class {name!r} at {_where(path)}: not a module:qualname")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - a missing module, or one failing to import
        raise DecodeError(f"refusing class {name!r} at {_where(path)}: its module cannot be imported "
                          f"({type(error).__name__}: {error})") from None
    for part in parts:
        target = vars(target).get(part) if hasattr(target, "__dict__") else None
    if not isinstance(target, type) or target.__module__ != module_name or target.__qualname__ != qualname:
        raise DecodeError(f"refusing class {name!r} at {_where(path)}: no such class is defined there")
    problem = _class_problem(target)
    if problem:
        raise DecodeError(f"refusing class {name!r} at {_where(path)}: {problem}")
    return target


class _Decoder:
    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = arrays
        self.used: set[str] = set()
        self.anchors: dict[int, Any] = {}

    def register(self, node: dict[str, Any], obj: Any, path: str) -> Any:
        if "id" in node:
            number = node["id"]
            if type(number) is not int or number in self.anchors:
                raise DecodeError(f"entry at {_where(path)} has a bad or repeated id {number!r}")
            self.anchors[number] = obj
        return obj

    def decode(self, node: Any, path: str) -> Any:
        kind = type(node)
        if node is None or kind in (bool, str, int, float):
            return node
        if kind is list:
            return [self.decode(v, f"{path}[{i}]") for i, v in enumerate(node)]
        if kind is not dict:
            raise DecodeError(f"unexpected {kind.__name__} at {_where(path)}")
        if TAG not in node:
            bad = [k for k in node if k.startswith("$")]
            if bad:
                raise DecodeError(f"unexpected key {bad[0]!r} at {_where(path)}")
            return {k: self.decode(v, _join(path, k)) for k, v in node.items()}
        tag = node[TAG]
        handler = getattr(self, f"tag_{tag}", None) if type(tag) is str and tag.isidentifier() else None
        if handler is None:
            raise DecodeError(f"unknown entry {tag!r} at {_where(path)}")
        return handler(node, path)

    def decode_items(self, node: dict[str, Any], path: str) -> list[Any]:
        items = node["items"]
        if type(items) is not list:
            raise DecodeError(f"items of {node[TAG]!r} at {_where(path)} are not a list")
        return items

    def fill_pairs(self, target: Any, node: dict[str, Any], path: str) -> Any:
        for i, pair in enumerate(self.decode_items(node, path)):
            if type(pair) is not list or len(pair) != 2:
                raise DecodeError(f"item {i} of {node[TAG]!r} at {_where(path)} is not a [key, value] pair")
            key = self.decode(pair[0], f"{path}[key {i}]")
            try:
                target[key] = self.decode(pair[1], _join(path, key))
            except TypeError as error:  # an unhashable key
                raise DecodeError(f"key {i} at {_where(path)}: {error}") from None
        return target

    # one method per tag
    def tag_float(self, node, path):
        _fields(node, path, ("value",))
        if node["value"] not in ("nan", "inf", "-inf"):
            raise DecodeError(f"float {node['value']!r} at {_where(path)} is not nan, inf or -inf")
        return float(node["value"])

    def tag_complex(self, node, path):
        _fields(node, path, ("real", "imag"))
        real, imag = self.decode(node["real"], path), self.decode(node["imag"], path)
        if type(real) is not float or type(imag) is not float:
            raise DecodeError(f"complex at {_where(path)} has non-float parts")
        return complex(real, imag)

    def tag_bytes(self, node, path):
        _fields(node, path, ("hex",))
        try:
            return bytes.fromhex(node["hex"])
        except (TypeError, ValueError):
            raise DecodeError(f"bytes at {_where(path)} are not hex") from None

    def tag_tuple(self, node, path):
        _fields(node, path, ("items",))
        return tuple(self.decode(v, f"{path}[{i}]") for i, v in enumerate(self.decode_items(node, path)))

    def tag_frozenset(self, node, path):
        _fields(node, path, ("items",))
        try:
            return frozenset(self.decode(v, f"{path}[{i}]") for i, v in enumerate(self.decode_items(node, path)))
        except TypeError as error:
            raise DecodeError(f"frozenset at {_where(path)}: {error}") from None

    def tag_set(self, node, path):
        _fields(node, path, ("items",))
        result = self.register(node, set(), path)
        for i, value in enumerate(self.decode_items(node, path)):
            try:
                result.add(self.decode(value, f"{path}[{i}]"))
            except TypeError as error:
                raise DecodeError(f"set at {_where(path)}: {error}") from None
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
        if name is not None and (type(name) is not str or name not in _FACTORIES):
            raise DecodeError(f"defaultdict factory {name!r} at {_where(path)} is refused")
        result = collections.defaultdict(None if name is None else _FACTORIES[name])
        return self.fill_pairs(self.register(node, result, path), node, path)

    def tag_deque(self, node, path):
        _fields(node, path, ("maxlen", "items"))
        maxlen = node["maxlen"]
        if maxlen is not None and (type(maxlen) is not int or maxlen < 0):
            raise DecodeError(f"deque maxlen {maxlen!r} at {_where(path)}")
        result = self.register(node, collections.deque(maxlen=maxlen), path)
        result.extend(self.decode(v, f"{path}[{i}]") for i, v in enumerate(self.decode_items(node, path)))
        return result

    def tag_ref(self, node, path):
        _fields(node, path, ("id",))
        if type(node["id"]) is not int or node["id"] not in self.anchors:
            raise DecodeError(f"reference at {_where(path)} names no earlier entry")
        return self.anchors[node["id"]]

    def tag_scalar(self, node, path):
        _fields(node, path, ("dtype", "hex"))
        dtype = _dtype(node["dtype"], path)
        try:
            data = bytes.fromhex(node["hex"])
        except (TypeError, ValueError):
            raise DecodeError(f"scalar at {_where(path)} is not hex") from None
        if len(data) != dtype.itemsize:
            raise DecodeError(f"scalar at {_where(path)} has {len(data)} bytes, {dtype} needs {dtype.itemsize}")
        return np.frombuffer(data, dtype=dtype)[0]

    def tag_dtype(self, node, path):
        _fields(node, path, ("descr",))
        return _dtype(node["descr"], path)

    def tag_ndarray(self, node, path):
        _fields(node, path, ("ref", "dtype", "shape"))
        ref = node["ref"]
        if type(ref) is not str or ref not in self.arrays:
            raise DecodeError(f"array {ref!r} at {_where(path)} is not in the array file")
        if ref in self.used:
            raise DecodeError(f"array {ref!r} is referred to twice (at {_where(path)})")
        self.used.add(ref)
        array = self.arrays[ref]
        if type(array) is not np.ndarray or array.dtype.str != node["dtype"] or list(array.shape) != node["shape"]:
            raise DecodeError(f"array {ref!r} at {_where(path)} is {getattr(array, 'dtype', '?')} "
                              f"{getattr(array, 'shape', '?')}, the state says {node['dtype']} {node['shape']}")
        return self.register(node, array, path)

    def tag_generator(self, node, path):
        _fields(node, path, ("bit_generator", "state"))
        name = node["bit_generator"]
        if name not in _BIT_GENERATORS:
            raise DecodeError(f"bit generator {name!r} at {_where(path)} is refused")
        bit_generator = getattr(np.random, name)(0)
        generator = self.register(node, np.random.Generator(bit_generator), path)
        state = self.decode(node["state"], f"{path}.bit_generator.state")
        try:
            bit_generator.state = state
        except (TypeError, ValueError, KeyError) as error:
            raise DecodeError(f"state of the {name} generator at {_where(path)}: {error}") from None
        return generator

    def tag_object(self, node, path):
        _fields(node, path, ("class", "fields"))
        cls = _resolve_class(node["class"], path)
        obj = self.register(node, object.__new__(cls), path)
        fields = self.fill_pairs({}, {TAG: "object", "items": node["fields"]}, path)
        if any(type(k) is not str for k in fields):
            raise DecodeError(f"{node['class']} at {_where(path)} has a non-str attribute name")
        obj.__dict__.update(fields)
        return obj
