"""The per-client vectors CFL and LayerCFL compare (``last_vector``): each client's latest
update of the decision arrays as it sent it (the paper), or, with ``similarity-decay`` > 0
(choice beyond the paper), its updates summed over the rounds it trained in with that decay;
exact, or with ``update-storage = sketch`` a float32 count sketch of ``sketch-dim`` numbers
(``clustering/sketch.py``, a linear map, so the sketch of the sum is the sum of sketches).

A client of a few dozen examples sends an update dominated by the noise of its batches; its
group's pull repeats every round while that noise does not, so the sum separates the groups
where one round's update cannot."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from clusterfed.clustering.sketch import Sketch, count_sketch
from clusterfed.strategies.exchange import TrainReply
from clusterfed.strategies.parts import Host, Part
from clusterfed.strategies.update_vectors import flatten


class VectorState(Protocol):
    """The strategy state the vectors live in: ``last_vector`` (client → vector) and the
    count sketch's spec (``sketch``; None: exact, or short enough to keep whole)."""

    last_vector: dict[str, np.ndarray]
    sketch: dict[str, Any] | None


class ClientVectors(Part[VectorState]):
    """Keeps ``last_vector`` up to date from each round's replies (module docstring)."""

    def __init__(self, host: Host[VectorState], *, sketch_dim: int, seed: int) -> None:
        super().__init__(host)
        self.sketch_dim = sketch_dim
        self.seed = seed

    def keep(self, replies: list[TrainReply], names: list[str], decay: float, compact: bool) -> None:
        """Each replier's vector of ``names``: its update as sent (decay 0), or ``decay`` × its
        previous vector + its update; ``compact``: in the count sketch (``keep_compact``)."""
        if compact:
            self.keep_compact(replies, names, decay)
            return
        last = self.state.last_vector
        for reply in replies:
            previous = last.get(reply.key)
            if previous is None or decay == 0:
                last[reply.key] = flatten(reply.update, names, dtype=None)  # as sent (float32)
            else:
                # a client's own updates summed with decay (float64): its persistent pull on the
                # model grows with every round, the noise of its few samples only as the square root
                last[reply.key] = decay * previous + flatten(reply.update, names)

    def keep_compact(self, replies: list[TrainReply], names: list[str], decay: float) -> None:
        """``update-storage = sketch``: each client's vector as a float32 count sketch of
        ``sketch-dim`` numbers (whole, in float32, when not longer); the decayed sum is
        summed in the sketch (the map is linear, so it is the sketch of the sum)."""
        if not replies:
            return
        state = self.state
        if state.sketch is None:
            dim = int(sum(np.size(replies[0].update[n]) for n in names))
            made = count_sketch(dim, self.sketch_dim, self.seed)
            state.sketch = None if made is None else made.spec
        mapped = Sketch.from_spec(state.sketch) if state.sketch is not None else None
        for reply in replies:
            vector = flatten(reply.update, names, dtype=np.float32)
            vector = mapped(vector) if mapped is not None else vector
            previous = state.last_vector.get(reply.key)
            state.last_vector[reply.key] = (vector if previous is None or decay == 0
                                            else (np.float32(decay) * previous + vector).astype(np.float32))
