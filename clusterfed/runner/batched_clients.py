"""The in-process engine's batched client executor: a round's messages that the built-in task
or the client helper's default loop would train (or evaluate) one after another are trained
together (``clusterfed.runner.batched_training``), on CUDA when the clients' device is CUDA,
on the CPU otherwise, in chunks sized from the device's free memory (and on the CPU from its
cache: ``client_steps.chunk_size``).

What it answers for: a ClientApp made by ``clusterfed.client.client_app`` whose task trains
with the default loop (no ``train_fn``) or a ``train_fn`` marked ``trains_with`` (the
built-in task's), and evaluates with the default loop or an ``evaluate_fn`` marked
``evaluates_on``; the app's mods must be ones it knows (the built-in fault injection).
Clients are trained together when their models are the same module (same class and layers,
same state names, shapes and dtypes) on the same device. Everything else (a user's own
train function, other mods, a model or loss ``vmap`` cannot take, the profile probe) runs
one after another as before, and the first time a reason keeps clients from being batched
it is logged once, naming it. A failure of the batched path never changes a result: its
clients are answered one after another instead.

A reply is built from the trained arrays directly (``trained_content``), not copied
through a serialisation round trip: it is new and shared with nobody. Its client's time,
for the round ``timeout``, is its share of its chunk's time.

torch is imported when the first round is batched, not with this module: the server side
of the engine does not need it.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flwr.app import Context, Message, MessageType
from flwr.common.logger import log

from clusterfed import faults, protocol
from clusterfed.client.app import evaluated_content, name_client, receive, trained_content, uses_warm_worker
from clusterfed.client.task import ClientTask, load_task
from clusterfed.secagg import secagg_mod

# ClientApp mods that only look at and change the reply, so that the reply computed together
# can be handed through them: the built-in fault injection, and the SecAgg+ mod (it hands the
# train function the message without its protocol record, which the batched training does
# not read, and masks the reply computed together)
KNOWN_MODS = (faults.inject_faults, secagg_mod)
FREE_MEMORY_SHARE = 0.5  # of the device's free memory, for one chunk
MAX_CHUNK: int | None = None  # an upper bound on a chunk's clients (tests set one); None: memory decides


@dataclass
class Prepared:
    """A message's answer computed ahead: the grid calls ``handler`` in place of the
    ClientApp; ``seconds``: the client's share of its chunk's time."""

    handler: Callable[[Message, Context], Message]
    seconds: float


@dataclass
class _Client:
    message_id: str
    message: Message
    context: Context
    config: dict
    data: Any
    received: dict
    choice: int | None
    steps: Any  # batched_training.ClientSteps


@dataclass
class BatchedClients:
    """Answers what it can of a round's messages together (``answers``)."""

    client_app: Any
    logged: set[str] = field(default_factory=set)
    signatures: dict[int, tuple] = field(default_factory=dict)  # id(model) -> (model, its signature), one pull
    chunks: list[dict[str, Any]] = field(default_factory=list)  # per chunk: kind, clients, seconds, peak bytes

    def why_not(self, reason: str) -> None:
        if reason not in self.logged:
            self.logged.add(reason)
            log(logging.INFO, "client-batching: %s; those clients run one after another", reason)

    def answers(self, calls: list[tuple[str, Message, Context]]) -> dict[str, Prepared]:
        """Prepared answers for the messages (id, message, node context) it can batch."""
        parts = getattr(self.client_app, "clusterfed_parts", None)
        if parts is None:
            self.why_not("the ClientApp is not made by clusterfed.client.client_app")
            return {}
        unknown = [getattr(mod, "__name__", repr(mod)) for mod in parts.mods if mod not in KNOWN_MODS]
        if unknown:
            self.why_not(f"the ClientApp's mods {unknown} may change a message before its client sees it")
            return {}
        task = load_task(parts.task) if isinstance(parts.task, str) else parts.task
        self.signatures.clear()  # kept for one pull: a model_fn may build a new model every call
        groups: dict[tuple, list[_Client]] = {}
        for message_id, message, context in calls:
            prepared = self._prepare(task, parts, message_id, message, context)
            if prepared is not None:
                signature, client = prepared
                groups.setdefault(signature, []).append(client)
        out: dict[str, Prepared] = {}
        for (kind, _, device, _), clients in groups.items():
            if len(clients) > 1:
                out.update(self._run(task, parts, kind, clients, device))
        return out

    def _prepare(self, task: ClientTask, parts, message_id: str, message: Message, context: Context):
        kind = message.metadata.message_type
        if kind not in (MessageType.TRAIN, MessageType.EVALUATE) or protocol.CONFIG not in message.content:
            return None
        if message.content[protocol.CONFIG].get("phase") in (protocol.PROFILE_PHASE, protocol.CHOOSE_PHASE):
            return None
        if isinstance(parts.task, str) and uses_warm_worker(context.node_config):
            self.why_not("a warm worker answers the task's messages")
            return None
        own = task.train_fn if kind == MessageType.TRAIN else task.evaluate_fn
        if own is not None and not hasattr(own, "local_sgd" if kind == MessageType.TRAIN else "evaluated_on"):
            self.why_not(f"the task's own {'train_fn' if kind == MessageType.TRAIN else 'evaluate_fn'} "
                         f"{getattr(own, '__name__', own)!r}")
            return None
        from clusterfed.runner import client_steps

        try:  # a client that fails here fails again one after another, with its error reply
            if parts.check is not None:
                parts.check(context)
            config, data, model, device, received, choice = receive(task, message.content, context)
            steps, loss_key = client_steps.of(task, kind, model, data, config, device)
        except Exception:  # noqa: BLE001
            return None
        if id(model) not in self.signatures:  # the built-in task hands every client one model object
            self.signatures[id(model)] = (model, client_steps.model_signature(model))
        signature = (kind, self.signatures[id(model)][1], str(device), loss_key)
        return signature, _Client(message_id, message, context, config, data, received, choice, steps)

    def _run(self, task: ClientTask, parts, kind: str, clients: list[_Client], device: str) -> dict[str, Prepared]:
        from clusterfed.runner import client_steps

        model = task.model_fn(clients[0].context, clients[0].config)
        loss_fn = client_steps.loss_of(task, kind)
        seed = zlib.crc32(repr((clients[0].config.get("server-round"), [c.context.node_id for c in clients])).encode())
        out: dict[str, Prepared] = {}
        try:
            for chunk, results, seconds, peak in client_steps.in_chunks(model, kind, [c.received for c in clients],
                                                                        [c.steps for c in clients], loss_fn, device,
                                                                        seed, MAX_CHUNK, FREE_MEMORY_SHARE):
                self.chunks.append({"kind": kind, "clients": len(chunk), "seconds": seconds, "peak_bytes": peak})
                for index, result in zip(chunk, results):
                    client = clients[index]
                    content = (trained_content(task, client.context, client.config, client.data, client.received,
                                               client.choice, result[0], {"train-loss": result[1]})
                               if kind == MessageType.TRAIN else
                               evaluated_content(task, client.context, client.data,
                                                 {"eval-loss": result[0], "eval-accuracy": result[1]}))
                    out[client.message_id] = Prepared(_through_mods(task, parts.mods, content), seconds / len(chunk))
        except Exception as error:  # noqa: BLE001 - never a wrong result: the rest go one after another
            self.why_not(f"training {type(model).__name__} together failed ({type(error).__name__}: {error})")
        return out


def _through_mods(task: ClientTask, mods: tuple, content) -> Callable[[Message, Context], Message]:
    """What the ClientApp would do with a reply of ``content``: its mods around it, and an
    error naming the client key."""
    def handler(message: Message, context: Context) -> Message:
        def innermost(msg: Message, _context: Context) -> Message:
            return Message(content, reply_to=msg)

        call = innermost
        for mod in reversed(mods):
            call = (lambda inner, mod: lambda msg, ctx: mod(msg, ctx, inner))(call, mod)
        try:
            return call(message, context)
        except Exception as error:
            name_client(task, context, error)
            raise

    return handler
