"""Client-side fault injection for tests and benchmarks (off by default).

Each train message draws at most one fault from the run config's rates, seeded by
(seed, client key, round, phase), so a run, and a resumed run, fault the same way:
``fault-rate`` the client raises; ``fault-nan-rate`` NaN/Inf weights; ``fault-shape-rate``
a wrong shape or a missing/extra array; ``fault-slow-rate`` the reply comes
``fault-delay`` seconds late (past the round ``timeout`` when the delay is longer).
Evaluate messages draw only the raising and slow faults.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping

import numpy as np

from clusterfed import protocol

FAULT_KEYS = ("fault-rate", "fault-nan-rate", "fault-shape-rate", "fault-slow-rate", "fault-delay")
KINDS = ("raise", "nan", "shape", "slow")
_RATE_OF_KIND = {"raise": "fault-rate", "nan": "fault-nan-rate", "shape": "fault-shape-rate", "slow": "fault-slow-rate"}


class InjectedFault(RuntimeError):
    """The client raises on purpose (``fault-rate``)."""


class _Clock:
    """Where a slow fault waits. The in-process engine swaps in a virtual clock, so that a
    late reply is late without the test waiting for it."""

    sleep = staticmethod(time.sleep)


clock = _Clock()


def _uniform(*parts: object) -> float:
    digest = hashlib.sha256(repr(("fault",) + parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**64


def draw_fault(config: Mapping[str, object], key: str, server_round: int, phase: str,
               kinds: tuple[str, ...] = KINDS) -> str | None:
    """The fault this message suffers, or None. Rates add up in ``KINDS`` order."""
    u = _uniform(config.get("seed", 0), key, server_round, phase)
    edge = 0.0
    for kind in kinds:
        edge += float(config.get(_RATE_OF_KIND[kind], 0.0) or 0.0)
        if u < edge:
            return kind
    return None


def corrupt(arrays: dict[str, np.ndarray], kind: str, key: str, server_round: int) -> dict[str, np.ndarray]:
    """A damaged copy of a reply's arrays: NaN/Inf values, or a wrong shape / missing /
    extra array."""
    rng = np.random.default_rng(int(_uniform("corrupt", key, server_round) * 2**32))
    out = {name: value.copy() for name, value in arrays.items()}
    name = sorted(out)[int(rng.integers(len(out)))]
    if kind == "nan":
        flat = out[name].reshape(-1)
        flat[int(rng.integers(flat.size))] = np.nan if rng.random() < 0.5 else np.inf
        return out
    variant = int(rng.integers(3))
    if variant == 0:  # wrong shape
        out[name] = np.zeros(out[name].size + 1, dtype=out[name].dtype)
    elif variant == 1 and len(out) > 1:  # missing array
        del out[name]
    else:  # extra array
        out["unexpected.weight"] = np.zeros(3, dtype=np.float32)
    return out


_KINDS_OF_MESSAGE = {"train": KINDS, "evaluate": ("raise", "slow")}


def inject_faults(msg, context, call_next):
    """A Flower ClientApp mod: the built-in task's injected faults (off unless a fault rate is
    set in the message config). The fault is drawn for the client key the reply names; the
    client raises (``InjectedFault``), replies ``fault-delay`` late, or replies with damaged
    arrays (``corrupt``)."""
    reply = call_next(msg, context)
    kinds = _KINDS_OF_MESSAGE.get(msg.metadata.message_type)
    if kinds is None or reply.has_error() or protocol.CONFIG not in msg.content:
        return reply
    config = msg.content[protocol.CONFIG]
    if config.get("phase") == protocol.PROFILE_PHASE:  # the profile probe is not faulted
        return reply
    if not any(float(config.get(_RATE_OF_KIND[kind], 0.0) or 0.0) > 0 for kind in kinds):
        return reply
    key = str(reply.content[protocol.CLIENT]["client-key"])
    server_round = int(config["server-round"])
    fault = draw_fault(config, key, server_round, str(config.get("phase", "train")), kinds)
    if fault == "raise":
        raise InjectedFault(f"injected fault (fault-rate) at round {server_round}")
    if fault == "slow":
        clock.sleep(float(config.get("fault-delay", 0.0) or 0.0) or float(config.get("timeout", 600.0)) + 1.0)
    if fault in ("nan", "shape"):
        arrays = protocol.from_array_record(reply.content[protocol.ARRAYS])
        reply.content[protocol.ARRAYS] = protocol.to_array_record(corrupt(arrays, fault, key, server_round))
    return reply
