"""Declared, checkpointable state: a strategy's ``State`` dataclass holds everything that
decides later rounds. Attributes named in ``State`` live in ``self.state``; reading or writing
``self.<field>`` goes there, and setting an undeclared attribute after construction is an
error, so nothing the algorithm remembers can be missed by a checkpoint."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, ClassVar


class DeclaredState:
    """``self.<field>`` of ``State`` reads and writes ``self.state``; ``get_state`` /
    ``set_state`` move all of it as plain data. ``__init__`` sets ``_sealed`` when done."""

    State: ClassVar[type]

    def __getattr__(self, name: str) -> Any:
        state = self.__dict__.get("state")
        if state is not None and name in _fields(type(state)):
            return getattr(state, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        state = self.__dict__.get("state")
        if state is not None and name in _fields(type(state)):
            setattr(state, name, value)
            return
        if self.__dict__.get("_sealed") and name not in self.__dict__ and not hasattr(type(self), name):
            raise AttributeError(f"{type(self).__name__}.{name} is not declared: add it to {self.State.__name__} "
                                 f"(state, checkpointed) or set it in __init__")
        object.__setattr__(self, name, value)

    def get_state(self) -> dict[str, Any]:
        """Everything that decides later rounds, as plain data (a deep copy of ``State``'s fields)."""
        return copy.deepcopy({f: getattr(self.state, f) for f in _fields(type(self.state))})

    def set_state(self, state: dict[str, Any]) -> None:
        unknown = set(state) - set(_fields(self.State))
        if unknown:
            raise ValueError(f"state fields {sorted(unknown)} are not part of {self.State.__name__}")
        self.state = self.State(**copy.deepcopy(state))



def _fields(cls: type) -> tuple[str, ...]:
    cached = _FIELDS.get(cls)
    if cached is None:
        cached = _FIELDS[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return cached




_FIELDS: dict[type, tuple[str, ...]] = {}
