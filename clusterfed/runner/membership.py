"""Who takes part: the nodes Flower lists, profiled into clients with stable keys.

A node seen for the first time is sent a profile probe (an evaluate message of phase
``profile``, carrying the initial model unless its client is known to be a clusterfed
client). A clusterfed client answers with its profile; a stock Flower ClientApp evaluates the
model, and is keyed by the name it gives in that reply (``stock_key``) or by its node id.
A node whose key is known (a restarted device, a resumed run) takes that client's place,
unless the key's node is listed and answered its last round (a duplicate key: neither is
used until one is gone). Deployment: ``absent-after`` misses in a row mark a client
absent; it keeps its place in the algorithm's assignment and is asked for its profile
again while Flower lists its node. The run's first probe waits ``probe-timeout`` (at least
the round ``timeout``: a ClientApp's cold start); a node that misses a probe is probed again
the next round. Every client the run has met stays in ``result.assignment``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from flwr.app import ArrayRecord, Message, MessageType, RecordDict
from flwr.supercore import log

from clusterfed import protocol
from clusterfed.runner.link import Link
from clusterfed.runner.newcomers import SimulatedNewcomers
from clusterfed.runner.replies import (
    LOAD_ERROR,
    NO_EVALUATE_HANDLER,
    STOCK_KEY_PREFIX,
    full_text,
    is_profile,
    key_in_reason,
    stock_key,
)
from clusterfed.runner.validation import ReplyRejected, parse_profile_reply
from clusterfed.core.contract import CAPABILITIES, LABEL_STATS, CapabilityError, ClientFailureError, ModelMismatchError
from clusterfed.core.exchange import ClientInfo, natural
from clusterfed.strategies.base import ClusteredStrategy


PROBE = "profile probe"  # the phase a failure of the probe is logged under
# a known client's place in ``result.assignment`` when the strategy never placed it (the
# ``cluster-id`` a client in no cluster is sent, too)
UNASSIGNED = -1


def told_capabilities(content: RecordDict) -> tuple[frozenset[str], tuple[str, ...]]:
    """What a clusterfed client's profile lists as capabilities, and its notes on how to give
    the others (``capabilities-missing``); a single string counts as a list of one."""
    client = content[protocol.CLIENT]

    def strings(value: Any) -> list[str]:
        return [value] if isinstance(value, str) else [str(v) for v in (value or [])]

    return (frozenset(strings(client.get(protocol.CAPABILITIES_KEY))),
            tuple(strings(client.get(protocol.CAPABILITIES_MISSING_KEY))))


class Membership:
    """The clients of one run and the nodes they are on."""

    def __init__(self, strategy: ClusteredStrategy, newcomers: SimulatedNewcomers, absent_after: int = 2,
                 probe_timeout: float = 0.0):
        self.strategy = strategy
        # seconds the run's first profile probe waits (at least the round timeout): a node's
        # first reply may come after a cold start (its ClientApp importing torch, loading data)
        self.probe_timeout = probe_timeout
        self.probed = False  # the first probe was sent
        self.newcomers = newcomers
        self.absent_after = absent_after
        self.deployment = False  # set by the driver: nodes may join late and go absent
        # the run's client table (key -> profile): the membership's own; the strategy reads it
        # through the read-only view each round hands it (``table``)
        self.clients: dict[str, ClientInfo] = {}
        self.stock: set[str] = set()  # keys of stock Flower ClientApps (no profile)
        self.node_of_key: dict[str, int] = {}
        self.key_of_node: dict[int, str] = {}
        # a resumed run: the client each node served before the stop (from the checkpoint),
        # to name a node that fails before it says its key again
        self.last_key_of_node: dict[int, str] = {}
        self.link = Link(self.node_of_key, self.last_key_of_node)
        self.misses: dict[str, int] = {}
        self.absent: set[str] = set()
        # nodes whose profile failed (never admitted): misses in a row, and those marked absent
        # (node id -> the key their error reply named, or None)
        self.node_misses: dict[int, int] = {}
        self.benched: dict[int, str | None] = {}
        # client keys claimed by more than one live node: key -> {node: its profile}; neither
        # claimant is trained or evaluated until only one is listed
        self.duplicates: dict[str, dict[int, ClientInfo | None]] = {}
        # per client: failures in a row and the last reason (status.json's "failing")
        self.failing: dict[str, tuple[int, str]] = {}
        self.probe_record = ArrayRecord()  # the initial model, sent with the profile probe
        self.probe_bytes = 0  # array bytes the profile probes carried
        self.probe_config: dict[str, Any] = {}  # what the probe carries besides phase and round
        # what each clusterfed client's profile says its task gives, and how to give the rest
        # (key -> (capabilities, notes)); stock clients are in ``stock``
        self.told: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {}

    # ------------------------------------------------------------ who is in
    def table(self) -> Mapping[str, ClientInfo]:
        """The client table as a strategy reads it: a read-only view that follows the table."""
        return MappingProxyType(self.clients)

    def active_keys(self) -> list[str]:
        return sorted((k for k in self.clients if k not in self.newcomers.held_back and k not in self.absent
                       and k not in self.duplicates), key=natural)

    def known_keys(self) -> list[str]:
        """Every client of the run so far, by name: the admitted ones (absent, failing and never
        placed ones included; not the simulated newcomers still held back) and each node whose
        profile probe failed and that never became a client (by the key its error named, else
        ``node-<id>``): what a reported accuracy is over, and ``result.assignment``'s keys."""
        keys = {k for k in self.clients if k not in self.newcomers.held_back}
        for node in self.node_misses:
            if node not in self.key_of_node:
                named = self.benched.get(node) or self.last_key_of_node.get(node)
                keys.add(named if named is not None else f"{STOCK_KEY_PREFIX}{node}")
        return sorted(keys, key=natural)

    def final_assignment(self) -> dict[str, int]:
        """Every client the run knows (``known_keys``): its cluster (a client that failed keeps
        its last one), or ``UNASSIGNED`` where the strategy never placed it (it failed, or never
        answered when asked to join): no client drops out of ``result.assignment``."""
        return {**{key: UNASSIGNED for key in self.known_keys()}, **self.strategy.assignment}

    def absent_devices(self) -> list[dict[str, Any]]:
        """Clients marked absent and nodes whose profile kept failing, one shape:
        ``{"client": key or None, "node": node id or None}``."""
        devices = [{"client": key, "node": self.node_of(key)} for key in sorted(self.absent, key=natural)]
        return devices + [{"client": key, "node": node} for node, key in sorted(self.benched.items())
                          if key not in self.absent]

    def node_of(self, key: str) -> int | None:
        """The node a client is on, or the node whose failing profile named it."""
        if key in self.node_of_key:
            return self.node_of_key[key]
        return next((node for node, named in self.benched.items() if named == key), None)

    def device_report(self) -> dict[str, Any]:
        """For status.json: the devices absent at the end and those whose last replies failed
        (``{"client", "node", "failures": in a row, "reason": the last}``)."""
        failing = [{"client": key, "node": self.node_of(key), "failures": count, "reason": reason}
                   for key, (count, reason) in sorted(self.failing.items(), key=lambda item: natural(item[0]))]
        return {"absent": self.absent_devices(), "failing": failing}

    def note_failures(self, failures: list[dict[str, Any]]) -> None:
        """This round's failures, per client: rounds in a row (not replies) and the last reason."""
        last_reason = {f["client"]: f["reason"] for f in failures if f.get("client") is not None}
        for key, reason in last_reason.items():
            self.failing[key] = (self.failing.get(key, (0, ""))[0] + 1, reason)
        for key in self.link.answered - self.link.failed_keys:
            self.failing.pop(key, None)

    def update_absence(self, server_round: int) -> None:
        """Deployment: a client messaged this round that never replied with usable content
        (an error reply, a rejected reply or none) misses the round; ``absent-after`` misses
        in a row mark it absent. An absent client keeps its place in the algorithm's
        assignment and is not messaged again until a profile (of a restarted node, or of its
        node if Flower still lists it) brings its key back."""
        if not self.deployment:
            return
        for key in self.link.messaged:
            if key in self.link.answered and key not in self.link.failed_keys:
                self.misses[key] = 0
                continue
            self.misses[key] = self.misses.get(key, 0) + 1
            if self.misses[key] >= self.absent_after and key not in self.absent:
                self.absent.add(key)
                log(logging.WARNING, "round %s: client %s (node %s) failed or was unreachable in %d rounds in a "
                    "row: marked absent, not messaged until it answers a profile probe again",
                    server_round, key, self.node_of_key.get(key), self.misses[key])

    def absent_until_seen(self, server_round: int) -> None:
        """A resumed run knows its clients from the checkpoint, but not their nodes until they
        answer: those whose device has not answered the first probe are absent, never
        messaged without a node, until a probe of theirs brings them back."""
        unseen = sorted((k for k in self.clients if k not in self.node_of_key and k not in self.absent), key=natural)
        if unseen:
            self.absent.update(unseen)
            log(logging.WARNING, "round %s: resumed run: %d client(s) not connected yet, absent until they answer "
                "a profile probe: %s", server_round, len(unseen), ", ".join(unseen[:10]) + (" …" if len(unseen) > 10
                                                                                           else ""))

    def check_capabilities(self) -> None:
        """Before round 1: a strategy that needs more than a stock ClientApp gives stops with
        one message naming the capability and the stock clients."""
        needed = self.strategy.requires()
        # a client helper's profile names what its task cannot give, and how to give it; only
        # what a client says it lacks refuses it (a profile that names nothing is taken as before)
        lacking = {key: needed & {note.split(":")[0] for note in notes} for key, (_, notes) in self.told.items()
                   if key in self.clients and key not in self.stock}
        lacking = {key: missing for key, missing in lacking.items() if missing}
        if lacking:
            missing = set().union(*lacking.values())
            what = "; ".join(CAPABILITIES[c] for c in sorted(missing))
            keys = sorted(lacking, key=natural)
            names = ", ".join(keys[:5]) + (" …" if len(keys) > 5 else "")
            notes = sorted({note for key in keys for note in self.told[key][1] if note.split(":")[0] in missing})
            raise CapabilityError(
                f"strategy {self.strategy.name!r} needs clients capable of {what}, but {len(keys)} client(s) say "
                f"their task cannot: {names}. " + " ".join(notes))
        if needed and self.stock:
            what = "; ".join(CAPABILITIES[c] for c in sorted(needed))
            nodes = ", ".join(sorted(self.stock, key=natural)[:5]) + (" …" if len(self.stock) > 5 else "")
            raise CapabilityError(
                f"strategy {self.strategy.name!r} needs clients capable of {what}, but {len(self.stock)} client(s) "
                f"answer as a stock Flower ClientApp (no profile): {nodes}. Build the ClientApp with "
                f"clusterfed.client (see the README, 'Use clusterfed in your own Flower app')"
                + (f", or {self.strategy.stock_alternative}." if self.strategy.stock_alternative else "."))

    # ------------------------------------------------------------ discovery
    def probe_messages(self, server_round: int, nodes: list[int]) -> list[Message]:
        """The profile probe of each node: an evaluate message of phase ``profile`` carrying
        what an evaluate message carries (a stock ClientApp evaluates it) and the train
        config (a clusterfed client builds its data from it); it carries the initial model
        unless the node's client is known to be a clusterfed client (a stock ClientApp
        evaluates the model it is sent, and would fail without one)."""
        config = protocol.config_record({**self.probe_config, "server-round": server_round,
                                         "phase": protocol.PROFILE_PHASE,
                                         "label-stats": LABEL_STATS in (self.strategy.requires()
                                                                        | getattr(self.strategy, "wants", set)())})
        helper_nodes = {self.node_of_key[k] for k in self.clients if k not in self.stock and k in self.node_of_key}
        helper_nodes |= {n for n, key in self.benched.items() if key is not None}  # it named itself: a helper
        messages = []
        for node in nodes:
            content = RecordDict({protocol.CONFIG: config})
            if node not in helper_nodes:
                content[protocol.ARRAYS] = self.probe_record
                self.probe_bytes += protocol.message_array_bytes(content)
            messages.append(Message(content, dst_node_id=node, message_type=MessageType.EVALUATE,
                                    group_id=str(server_round)))
        return messages

    def discover(self, server_round: int) -> None:
        """Profile the nodes seen for the first time, and the listed nodes of absent clients
        (they may be back). Deployment: nodes that join after the first round are profiled
        here and then placed by the algorithm's ``admit``. Before any probe is sent, the
        population (the clients known, or the nodes listed if more) is checked against the
        strategy's dp_* settings."""
        live = list(self.link.grid.get_node_ids())
        self.strategy.check_population(max(len(live), len(self.clients)))
        self.resolve_duplicates(server_round, live)
        for node in [n for n, key in self.benched.items() if key is None and n not in live]:
            del self.benched[node]  # a device that never said its key and whose node is gone: forgotten
        claimants = {n for claim in self.duplicates.values() for n in claim}
        new_nodes = [n for n in live if n not in self.key_of_node and n not in claimants and n not in self.benched]
        # an absent client's node that Flower still lists is asked again: it may be back
        # (a failed re-probe is not counted as a new fault: the client is known to be absent)
        probes = {self.node_of_key[k] for k in self.absent if self.node_of_key.get(k) in live}
        probes |= {n for n in self.benched if n in live}
        new_nodes += sorted(probes - set(new_nodes))
        if not new_nodes:
            return
        first_contact = not self.clients
        wait = self.link.timeout if self.probed else max(self.link.timeout, self.probe_timeout)
        self.probed = True
        message_ids, replies = self.link.push(self.probe_messages(server_round, new_nodes), wait)
        reasons, load_errors = self.admit_replies(server_round, dict(zip(message_ids, new_nodes)), replies,
                                                  probes, live, wait)
        if first_contact and not self.clients:
            if load_errors:  # the probe evaluates start()'s initial_arrays: they do not load
                raise ModelMismatchError(
                    f"the clients cannot load the initial arrays: start()'s initial_arrays are not the model "
                    f"the ClientApp trains; give start() that model's arrays (ArrayRecord(Net().state_dict())). "
                    f"{load_errors[0]}")
            raise ClientFailureError(f"no client could be profiled; the first error: "
                                     f"{reasons[0] if reasons else 'no node answered'}")
        if first_contact:
            self.newcomers.hold_back(list(self.clients))

    def admit_replies(self, server_round: int, node_of_message: dict[str, int], replies: list[Message],
                      probes: set[int], live: list[int], wait: float) -> tuple[list[str], list[str]]:
        """Admit each node by its reply to the probe (sent ``wait`` seconds before); returns
        the reasons of the failed probes and of those whose arrays did not load, each in full."""
        reasons, load_errors = [], []
        answered = set()
        for reply in replies:
            node = node_of_message[reply.metadata.reply_to_message_id]
            answered.add(node)
            if reply.has_error() and NO_EVALUATE_HANDLER in reply.error.reason:
                self.admit_stock(server_round, node, f"{STOCK_KEY_PREFIX}{node}")
            elif reply.has_error() and node in probes:
                log(logging.DEBUG, "absent client's node %s still unreachable: %s", node, reply.error.reason)
            elif reply.has_error():
                key = key_in_reason(reply.error.reason)
                self.link.fail(server_round, "error", reply.error.reason, key, node, PROBE)
                reasons.append(f"node {node}: {full_text(reply.error.reason)}")
                if LOAD_ERROR.search(reply.error.reason):
                    load_errors.append(f"Client on node {node}: {full_text(reply.error.reason)}")
                self.profile_failed(server_round, node, key)
            elif not is_profile(reply.content):
                self.admit_stock(server_round, node, stock_key(reply.content, node), live)
            else:
                try:
                    info = parse_profile_reply(reply.content)
                except ReplyRejected as error:
                    self.link.reject(server_round, None, error, node=node)
                    reasons.append(str(error))
                    self.profile_failed(server_round, node, None)
                    continue
                self.told[info.key] = told_capabilities(reply.content)
                self.claim(server_round, node, info, live)
        for node in node_of_message.values():
            if node not in answered and node not in probes:
                self.link.fail(server_round, "timeout", f"no reply within {wait:g} s", None, node, PROBE)
                reasons.append(f"node {node}: no reply within {wait:g} s")
                self.profile_failed(server_round, node, None)
        return reasons, load_errors

    def profile_failed(self, server_round: int, node: int, key: str | None) -> None:
        """A node whose profile failed is never admitted; ``absent-after`` failures in a row
        mark it absent: it is then only asked for its profile again, and a failure of that is
        not a new fault."""
        key = self.last_key_of_node.get(node) if key is None else key
        self.node_misses[node] = self.node_misses.get(node, 0) + 1
        if self.node_misses[node] >= self.absent_after and node not in self.benched:
            self.benched[node] = key
            log(logging.WARNING, "round %s: %s failed its profile probe in %d rounds in a row: marked absent",
                server_round, f"client {key} (node {node})" if key is not None else f"node {node}",
                self.node_misses[node])

    def resolve_duplicates(self, server_round: int, live: list[int]) -> None:
        """A key claimed by several nodes goes to the one left listed, when only one is."""
        for key, claim in list(self.duplicates.items()):
            for node in [n for n in claim if n not in live]:
                del claim[node]
            if len(claim) > 1:
                continue
            del self.duplicates[key]
            if not claim:
                self.absent.add(key)
                continue
            node, info = next(iter(claim.items()))
            log(logging.WARNING, "round %s: client-key %r is now claimed by node %s alone: it takes part again",
                server_round, key, node)
            self.admit_node(server_round, node, info if info is not None else self.clients[key])

    def contest(self, server_round: int, key: str, owner: int, node: int, info: ClientInfo) -> None:
        claim = self.duplicates.setdefault(key, {owner: self.clients.get(key)})
        claim[node] = info
        log(logging.WARNING, "round %s: client-key %r is claimed by nodes %s: neither is trained nor evaluated "
            "until only one of them is connected; give each SuperNode its own client-key",
            server_round, key, ", ".join(map(str, sorted(claim))))

    def admit_stock(self, server_round: int, node: int, key: str, live: list[int] | None = None) -> None:
        """A stock ClientApp: its size is learnt from its first train reply."""
        self.stock.add(key)
        self.claim(server_round, node, ClientInfo(key, 1, -1, stock=True), live or [])

    def claim(self, server_round: int, node: int, info: ClientInfo, live: list[int]) -> None:
        """``node`` says it is client ``info.key``: admitted, unless another listed node that
        answered its last round holds that key (then both wait: a duplicate key)."""
        owner = self.node_of_key.get(info.key)
        # Flower lists a dead node for a while: a key whose node missed its last
        # round (or is absent) may move to a new node
        owner_gone = info.key in self.absent or self.misses.get(info.key, 0) > 0
        if owner is not None and owner != node and owner in live and not owner_gone:
            self.contest(server_round, info.key, owner, node, info)
            return
        self.admit_node(server_round, node, info)

    def admit_node(self, server_round: int, node: int, info: ClientInfo) -> None:
        if node in self.benched:
            log(logging.INFO, "round %s: client %s on node %s answers its profile again", server_round, info.key, node)
        # the device is back (on this node, or restarted on a new one): no longer absent
        for benched in [n for n, key in self.benched.items() if n == node or key == info.key]:
            del self.benched[benched]
        self.node_misses.pop(node, None)
        self.key_of_node.pop(self.node_of_key.get(info.key, -1), None)
        if info.key in self.absent or self.node_of_key.get(info.key) not in (None, node):
            log(logging.INFO, "round %s: client %s is back on node %s", server_round, info.key, node)
        self.absent.discard(info.key)
        self.misses[info.key] = 0
        if info.key in self.clients and info.key in self.stock:
            info = self.clients[info.key]  # keep the size learnt from its replies
        self.clients[info.key] = info
        self.node_of_key[info.key] = node
        self.key_of_node[node] = info.key
