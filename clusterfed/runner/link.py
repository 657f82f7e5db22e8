"""The driver's side of Flower's Grid: sends each client its message, collects the replies
within the round ``timeout``, and counts array bytes each way and every failure, named by
client and node (``Traffic``). It knows nodes by the client keys ``Membership`` maps them to."""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

from clusterfed import protocol
from clusterfed.results import Traffic
from clusterfed.runner.replies import full_text
from clusterfed.runner.transport import push_and_collect
from clusterfed.runner.validation import ReplyRejected
from clusterfed.core.exchange import Arrays


class Link:
    """One run's messages. Per round: ``traffic`` (bytes, faults, the failures named),
    ``messaged`` / ``answered`` / ``failed_keys`` (client keys), ``lags`` (seconds from a
    reply's creation to its pick-up)."""

    def __init__(self, node_of_key: dict[str, int], last_key_of_node: dict[int, str]):
        self.node_of_key = node_of_key  # Membership's maps, shared
        self.last_key_of_node = last_key_of_node
        self.grid: Grid | None = None
        self.timeout = 3600.0
        self.new_round()

    def new_round(self) -> None:
        self.traffic = Traffic()
        self.answered: set[str] = set()
        self.messaged: set[str] = set()
        self.failed_keys: set[str] = set()  # clients whose reply this round was an error or rejected
        self.evidence_failed: set[str] = set()  # ... to an ask for evidence only (``settle`` decides)
        self.lags: list[float] = []

    def push(self, messages: list[Message], timeout: float | None = None) -> tuple[list[str], list[Message]]:
        """Send ``messages``; their ids (empty: not delivered) and the replies that came within
        ``timeout`` seconds (default: the round ``timeout``)."""
        return push_and_collect(self.grid, messages, self.timeout if timeout is None else timeout, self.lags)

    def fail(self, server_round: int, kind: str, reason: str, key: str | None, node: int | None,
             phase: str = "train", evidence: bool = False) -> None:
        """One failure (an error reply, no reply, an undeliverable message), named (a node
        that fails before it says its key, by the client it served before a resume), recorded
        and logged in one WARNING with the client's full error text; ``phase``: what it was asked
        (``train``, ``evaluate``, ``profile probe``); ``evidence``: an ask for a decision's
        evidence only (``settle``)."""
        named = self.last_key_of_node.get(node) if key is None else key  # a name, not a miss of that client
        text = full_text(reason)
        self.traffic.failures += 1
        self.traffic.fault(kind)
        self.traffic.failed.append({"client": named, "node": node, "kind": kind, "reason": text,
                                    **({"evidence": True} if evidence else {})})
        if key is not None:
            (self.evidence_failed if evidence else self.failed_keys).add(key)
        who = f"client {named} (node {node})" if named is not None else f"node {node}"
        log(logging.WARNING, "round %s: %s %s %s%s: %s", server_round, who, "failed in" if kind == "error" else "in",
            phase, " (asked for evidence only)" if evidence else "", text)

    def reject(self, server_round: int, key: str | None, error: ReplyRejected, node: int | None = None,
               evidence: bool = False) -> None:
        """A reply that failed validation: counted as a fault of its kind, named; ``evidence``:
        the reply to an ask for evidence only (``settle``)."""
        node = self.node_of_key.get(key) if node is None and key is not None else node
        self.traffic.rejected.append({"client": key, "node": node, "kind": error.kind, "reason": full_text(str(error)),
                                      **({"evidence": True} if evidence else {})})
        self.traffic.fault(error.kind)
        if key is not None:
            (self.evidence_failed if evidence else self.failed_keys).add(key)
        log(logging.WARNING, "round %s: rejected reply of client %s (node %s)%s: %s", server_round, key, node,
            " to an ask for evidence only" if evidence else "", error)

    def settle(self, trained: set[str]) -> None:
        """The round's failed clients: a failure of an ask for evidence only fails a client
        only when none of its trainings this round was accepted (``trained``): one that
        trained and was averaged did its round (a merge probe asks it a second time)."""
        self.failed_keys |= self.evidence_failed - trained

    def send(self, server_round: int, plan: dict[str, tuple[Arrays | None, dict[str, Any]]],
             message_type: str, evidence: Collection[str] = ()) -> tuple[dict[str, RecordDict], int]:
        """Send each client its (arrays, config); return the replies that arrived, by key,
        and the array bytes received. Error and missing replies are counted as faults
        (those of the clients in ``evidence``, asked for evidence only, as such)."""
        messages, keys = self.messages(server_round, plan, message_type)
        if not messages:
            return {}, 0
        message_ids, replies = self.push(messages)
        return self.collect(server_round, message_type, message_ids, keys, replies, evidence=evidence)

    def send_contents(self, server_round: int, contents: dict[str, RecordDict], message_type: str,
                      phase: str = "train") -> dict[str, RecordDict]:
        """Send each client its message ``content`` as it is (a secure-aggregation stage's);
        the replies that arrived, by key. Array bytes counted each way, failures recorded
        under ``phase``."""
        messages, keys = [], []
        for key, content in contents.items():
            self.traffic.down += protocol.message_array_bytes(content)
            messages.append(Message(content, dst_node_id=self.node_of_key[key], message_type=message_type,
                                    group_id=str(server_round)))
            keys.append(key)
            self.messaged.add(key)
        if not messages:
            return {}
        message_ids, replies = self.push(messages)
        return self.collect(server_round, message_type, message_ids, keys, replies, phase=phase)[0]

    def messages(self, server_round: int, plan: dict[str, tuple[Arrays | None, dict[str, Any]]],
                 message_type: str) -> tuple[list[Message], list[str]]:
        """Each client's message of ``plan`` (its arrays and config), with the array bytes down
        counted; the messages and their client keys, in order. ``send`` pushes them; Flower's
        single-phase hooks hand them to Flower's loop."""
        messages, keys = [], []
        # clients of one cluster are sent the same model object: encode it once per exchange
        # (the transport serialises, or the in-process grid copies, each message on its own)
        records: dict[int, tuple[Arrays, ArrayRecord]] = {}
        configs: dict[str, ConfigRecord] = {}  # and build each distinct config record once
        for key, (arrays, config) in plan.items():
            signature = repr(sorted(config.items()))
            if signature not in configs:
                configs[signature] = protocol.config_record(config)
            content = RecordDict({protocol.CONFIG: configs[signature]})
            if arrays is not None:
                if id(arrays) not in records:
                    records[id(arrays)] = (arrays, protocol.to_array_record(arrays))
                content[protocol.ARRAYS] = records[id(arrays)][1]
            nbytes = protocol.message_array_bytes(content)
            if message_type == MessageType.EVALUATE:
                self.traffic.eval_down += nbytes
            else:
                self.traffic.down += nbytes
            messages.append(Message(content, dst_node_id=self.node_of_key[key], message_type=message_type,
                                    group_id=str(server_round)))
            keys.append(key)
            self.messaged.add(key)
        return messages, keys

    def collect(self, server_round: int, message_type: str, message_ids: list[str], keys: list[str],
                replies: list[Message], phase: str | None = None,
                evidence: Collection[str] = ()) -> tuple[dict[str, RecordDict], int]:
        """The replies by key and the array bytes up; errors, undelivered messages and
        missing replies recorded as failures of their client (of an ask for evidence only
        for the clients in ``evidence``)."""
        key_of_message = dict(zip(message_ids, keys))
        phase = phase or ("evaluate" if message_type == MessageType.EVALUATE else "train")
        out: dict[str, RecordDict] = {}
        bytes_up = 0
        for reply in replies:
            key = key_of_message[reply.metadata.reply_to_message_id]
            if reply.has_error():
                self.fail(server_round, "error", reply.error.reason, key, self.node_of_key.get(key), phase,
                          key in evidence)
                continue
            self.answered.add(key)
            if message_type != MessageType.EVALUATE:
                nbytes = protocol.message_array_bytes(reply.content)
                self.traffic.up += nbytes
                bytes_up += nbytes
                self.traffic.transmissions += 1
            out[key] = reply.content
        replied = {reply.metadata.reply_to_message_id for reply in replies}
        for message_id, key in zip(message_ids, keys):
            if not message_id:
                self.fail(server_round, "unavailable", "its node is gone: the message was not delivered", key,
                          self.node_of_key[key], phase, key in evidence)
            elif message_id not in replied:
                self.fail(server_round, "timeout", f"no reply within {self.timeout:g} s", key, self.node_of_key[key],
                          phase, key in evidence)
        return out, bytes_up
