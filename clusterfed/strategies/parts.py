"""Parts a strategy composes (merging, stability windows, …): objects that read and write
fields of their strategy's ``State``, each declaring those fields as a ``typing.Protocol``.

A part keeps no state of its own: everything it remembers is a field of the strategy's
``State``, so checkpoints hold it. It reaches the state through its host on every use,
never through a stored reference: the strategy replaces its state object when it starts
(``init``) and when it resumes (``set_state``)."""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

S = TypeVar("S")
S_co = TypeVar("S_co", covariant=True)


class Host(Protocol[S_co]):
    """A strategy, as a part sees it: the owner of a state with the fields the part declares."""

    @property
    def state(self) -> S_co: ...


class Part(Generic[S]):
    """A part of ``host``; ``self.state`` is the host's current state, typed by the part's Protocol."""

    def __init__(self, host: Host[S]) -> None:
        self.host = host

    @property
    def state(self) -> S:
        return self.host.state
