"""What the checkpoint codec accepts, shared by its two directions: the tag key, the
defaultdict factories and bit generators that may be saved, which classes may be saved as
their ``__dict__`` and which dtypes as raw bytes, how a place in the state is named in an
error, and the error a refused tree raises."""

from __future__ import annotations

from typing import Any

import numpy as np

TAG = "$t"
_OWN = "clusterfed"
# defaultdict factories that may be saved (by name) and restored
FACTORIES = {f.__name__: f for f in (list, dict, set, frozenset, tuple, int, float, str, bool)}
# bit generators a Generator may use (their state is plain ints, strings and uint arrays)
BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")
# what a class must not define for its __dict__ to be its whole state
_CUSTOM_STATE = ("__reduce__", "__reduce_ex__", "__getstate__", "__setstate__", "__getnewargs__",
                 "__getnewargs_ex__", "__slots__")


class DecodeError(ValueError):
    """A tree this codec will not turn back into objects (foreign class, malformed entry)."""


def own_module(name: str) -> bool:
    return name == _OWN or name.startswith(_OWN + ".")


def class_problem(cls: type) -> str | None:
    """Why instances of ``cls`` cannot be saved as their ``__dict__`` (None: they can)."""
    if not own_module(cls.__module__):
        return f"{cls.__module__}.{cls.__qualname__} is not a clusterfed class"
    if "<locals>" in cls.__qualname__:
        return f"{cls.__module__}.{cls.__qualname__} is defined inside a function"
    for base in cls.__mro__:
        if base is object:
            continue
        if not own_module(base.__module__):
            return f"{cls.__qualname__} derives from {base.__module__}.{base.__qualname__}"
        for name in _CUSTOM_STATE:
            if name in vars(base):
                return f"{base.__qualname__} defines {name}"
    return None


def dtype_problem(dtype: np.dtype) -> str | None:
    if dtype.hasobject:
        return "object dtype"
    if dtype.fields is not None or dtype.subdtype is not None:
        return f"structured dtype {dtype}"
    return None


def join_path(path: str, key: Any) -> str:
    if isinstance(key, str) and key.isidentifier():
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def where(path: str) -> str:
    return path or "the state"
