"""A Flower ``Grid`` whose nodes are ClientApp calls in this process (no Ray).

Flower ships no Ray-free simulation backend; this exists because tests and benchmarks run
hundreds of short runs on two cores, where Ray's start-up (10-25 s) would dominate. A test
checks it gives the same numbers as Flower's simulation engine.

It relies on Flower 1.41 internals: ``Message.metadata`` has no public setter for the
message id (set through ``metadata.__dict__["_message_id"]``), and the SuperNode's
conversion of a raising ClientApp into an error reply (``ErrorCode.CLIENT_APP_RAISED_EXCEPTION``)
is re-done here.

Clients run when their replies are pulled: with ``client_batching = "auto"`` the clients of
a pull that the built-in task or the client helper's default loop trains are trained
together (``clusterfed.runner.batched_clients``), the others one after another.

Time: a client's reply takes its own compute time (its share of a batched chunk), but a deployed
federation runs them in parallel, so a reply counts as late when its own client's time
(compute plus any injected delay, which waits on a virtual clock instead of sleeping) is
over the time the server waits for it (the round ``timeout``, or the first probe's longer
wait: ``wait_at_least``); late replies are dropped as a SuperLink would never deliver
them in time.
"""

from __future__ import annotations

import pickle
import time
import types
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, Metadata, MetricRecord, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from clusterfed import faults
from clusterfed.runner.batched_clients import BatchedClients, Prepared

if TYPE_CHECKING:
    from clusterfed.runner.preflight import Checked


# Flower's message classes: plain objects whose state is their ``__dict__`` (no pickle hooks)
_CLONED = frozenset({Message, Metadata, RecordDict, ArrayRecord, ConfigRecord, MetricRecord, Array, Error})
# immutable: shared by the copy, as unpickling would give equal ones (an Array's bytes too)
_SHARED = frozenset({bytes, str, int, float, bool, type(None), types.FunctionType})


def _clone(value):
    kind = type(value)
    if kind in _SHARED:
        return value
    if kind in _CLONED:
        copy = kind.__new__(kind)
        copy.__dict__.update({name: item if type(item) in _SHARED else _clone(item)
                              for name, item in value.__dict__.items()})
        return copy
    if kind is dict:
        return {key: item if type(item) in _SHARED else _clone(item) for key, item in value.items()}
    if kind is list:
        return [item if type(item) in _SHARED else _clone(item) for item in value]
    if kind is tuple:
        if all(type(item) in _SHARED for item in value):
            return value
        return tuple(_clone(item) for item in value)
    return pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def _transfer(message: Message) -> Message:
    """An independent copy of a message, as crossing the network would give: what a pickle
    round trip gives (Flower's message classes keep their state in ``__dict__``), except that
    immutable values, an Array's bytes among them, are shared rather than copied; anything
    else (a record subclass, say) is pickled. A test checks it against pickle."""
    return _clone(message)


class _VirtualClock:
    def __init__(self):
        self.elapsed = 0.0

    def sleep(self, seconds: float) -> None:
        self.elapsed += float(seconds)


class InProcessGrid(Grid):
    def __init__(self, client_app, num_nodes: int, run_id: int = 1, timeout: float = float("inf"),
                 node_configs: list[dict] | None = None, run_config: dict | None = None,
                 client_batching: str = "auto"):
        if client_batching not in ("auto", "off"):
            raise ValueError(f"client_batching={client_batching!r}: use 'auto' or 'off'")
        self.client_app = client_app
        self.batched = BatchedClients(client_app) if client_batching == "auto" else None
        self.prepared: dict[str, Prepared] = {}  # answers the batched executor computed for this pull
        self._run_id = run_id
        self.timeout = timeout
        self.window = timeout  # how long the server waits for the replies of the messages it pushes next
        self.node_ids = [1000 + i for i in range(num_nodes)]
        configs = node_configs or [{"partition-id": i, "num-partitions": num_nodes} for i in range(num_nodes)]
        self.contexts = {
            node: Context(run_id=run_id, node_id=node, node_config=dict(configs[i]), state=RecordDict(),
                           run_config=dict(run_config or {}))
            for i, node in enumerate(self.node_ids)
        }
        self.pending: dict[str, Message] = {}

    @classmethod
    def for_run(cls, client_app, checked: Checked) -> InProcessGrid:
        """The federation a checked run asks for: ``num-clients`` nodes calling ``client_app``,
        replies late past the round ``timeout``, the run's ``client-batching``."""
        config = checked.config
        return cls(client_app, config.num_clients, timeout=config.timeout, client_batching=config.client_batching)

    @property
    def run(self):  # pragma: no cover - not used by clusterfed
        raise NotImplementedError

    def set_run(self, run_id: int) -> None:  # pragma: no cover
        self._run_id = run_id

    def create_message(self, *args, **kwargs):  # pragma: no cover - deprecated in Flower
        raise NotImplementedError("use the Message constructor")

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    def get_nodes(self):  # pragma: no cover
        return []

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            # copied when a ClientApp is called with it (``_call``), as crossing the network would
            self.pending[message.metadata.message_id] = message
            ids.append(message.metadata.message_id)
        return ids

    def pull_messages(self, reply_to_message_ids: Iterable[str] = (), *,
                      message_ids: Iterable[str] = ()) -> Iterable[Message]:
        """The replies to the pushed messages ``reply_to_message_ids`` (Flower 1.43's name;
        1.41/1.42 call it ``message_ids``; clusterfed passes it by position, which both take)."""
        wanted = list(reply_to_message_ids) + list(message_ids)
        taken = [(message_id, self.pending.pop(message_id)) for message_id in wanted if message_id in self.pending]
        if self.batched is not None and len(taken) > 1:
            self.prepared = self.batched.answers([(message_id, message, self.contexts[message.metadata.dst_node_id])
                                                  for message_id, message in taken])
        replies = []
        for _, message in taken:
            reply = self._call(message)
            if reply is not None:
                replies.append(reply)
        self.prepared = {}
        return replies

    def wait_at_least(self, seconds: float) -> None:
        """The server waits ``seconds`` for the replies of the messages it pushes next (its
        first profile probe waits longer than a round): a reply is late only past the longer
        of that and the grid's ``timeout``."""
        self.window = max(self.timeout, float(seconds))

    def nothing_in_flight(self) -> bool:
        """Every message pushed was answered or dropped as late: waiting longer gains nothing."""
        return not self.pending

    def _call(self, message: Message) -> Message | None:
        """The client's reply (None: late): computed with others' by the batched executor, or by
        calling the ClientApp."""
        prepared = self.prepared.pop(message.metadata.message_id, None)
        context = self.contexts[message.metadata.dst_node_id]
        clock, real = _VirtualClock(), faults.clock.sleep
        faults.clock.sleep = clock.sleep
        started = time.perf_counter()
        if prepared is not None:
            clock.elapsed += prepared.seconds
        try:
            if prepared is not None:  # answered from the message, which the batched executor only read
                reply = prepared.handler(message, context)
            else:  # a copy stands in for serialisation: the client never shares arrays with the server
                reply = self.client_app(_transfer(message), context)
        except Exception as error:  # the SuperNode turns a raising ClientApp into an error reply
            reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=f"{type(error).__name__}: {error}"),
                            reply_to=message)
        finally:
            faults.clock.sleep = real
        if time.perf_counter() - started + clock.elapsed > self.window:
            return None
        # a reply computed together is new and shared with nobody: no copy stands in for the network
        return reply if prepared is not None and not reply.has_error() else _transfer(reply)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))
