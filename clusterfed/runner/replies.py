"""What a client's reply says about the client: its error text in full or cut to one line
(Flower's and the simulation engine's wrappers taken off), the key it names in that text, whether a probe
reply is a clusterfed profile, and the name a stock Flower ClientApp gives itself."""

from __future__ import annotations

import json
import re

from flwr.app import RecordDict

from clusterfed import protocol

# Flower's ClientApp answers a message type it has no function for with this error (a stock
# ClientApp without an evaluate function, probed)
NO_EVALUATE_HANDLER = "No evaluate function registered"
STOCK_KEY_PREFIX = "node-"
# how a stock ClientApp may name itself in its evaluate reply: a number under one of these
# names in its metrics or a ConfigRecord, or a "client" ConfigRecord with a "client-key" (as
# clusterfed's clients send)
STOCK_KEY_METRICS = ("client-key", "partition-id")
# how clusterfed's ClientApp names itself in an error reply (clusterfed.client.app.ClientFailure)
KEY_IN_REASON = re.compile(r'\[client-key ("(?:[^"\\]|\\.)*")\]\s*')
# Flower's SuperNode wraps a ClientApp's exception as "<class 'X'>:<'message'>"
FLOWER_REASON = re.compile(r"^<class '([^']*)'>:<'(.*)'>$", re.DOTALL)
# Flower's simulation engine (Ray) wraps it again: a RayTaskError whose text is the client's
# traceback, then "The above exception was the direct cause", then Flower's ClientAppException
RAY_CAUSE = "The above exception was the direct cause of the following exception"
CLIENT_APP_EXCEPTION = "Exception ClientAppException occurred. Message: "
ANSI = re.compile(r"\x1b\[[0-9;]*m")
REASON_CHARS = 300
# a failure's full text is kept whole up to this length (a model's list of missing keys can run long)
FULL_REASON_CHARS = 4000


def key_in_reason(reason: str) -> str | None:
    """The client key a clusterfed ClientApp put into its error reply, if any."""
    match = KEY_IN_REASON.search(reason or "")
    if match is None:
        return None
    try:
        return str(json.loads(match.group(1)))
    except ValueError:
        return None


def client_exception(text: str) -> str:
    """The client's own ``Type: message`` out of a Ray-wrapped reason: the exception line after
    the last frame of the client's traceback (before Flower re-raised it), else Flower's
    ``ClientAppException`` message; ``text`` itself when it is not Ray's."""
    if RAY_CAUSE in text:
        lines = text.split(RAY_CAUSE)[0].rstrip().splitlines()
        frames = [i for i, line in enumerate(lines) if line.startswith("  File ")]
        if frames:
            rest = lines[frames[-1] + 1:]
            while rest and rest[0].startswith("    "):  # the frame's source line(s)
                rest = rest[1:]
            if rest:
                kind, sep, message = "\n".join(rest).partition(": ")
                return f"{kind.rpartition('.')[2]}{sep}{message}"
    if CLIENT_APP_EXCEPTION in text:
        return text.split(CLIENT_APP_EXCEPTION, 1)[1]
    return text


def client_text(reason: str) -> str:
    """An error reply's reason as the client raised it: ``Type: message`` with every line of
    the message (Flower's ``<class ...>:<'...'>`` wrapper, the simulation engine's Ray
    wrapper, terminal colours and the client-key tag taken off)."""
    text = ANSI.sub("", str(reason or ""))
    match = FLOWER_REASON.match(text.strip())
    if match is not None:
        inner = match.group(2)
        text = client_exception(inner) if RAY_CAUSE in inner or CLIENT_APP_EXCEPTION in inner else \
            f"{match.group(1).rpartition('.')[2]}: {inner}"
    return KEY_IN_REASON.sub("", text, count=1).strip()


def first_line(reason: str, lines: int = 1) -> str:
    """An error reply's reason (``client_text``) as one line: the first non-empty line (the
    first ``lines`` joined, for a message that must show more), at most ``REASON_CHARS``
    characters a line."""
    parts = [part.strip() for part in client_text(reason).splitlines() if part.strip()][:lines]
    return " ".join(part if len(part) <= REASON_CHARS else part[:REASON_CHARS - 1] + "…" for part in parts)


def full_text(reason: str) -> str:
    """An error reply's reason (``client_text``) with all its lines, as a WARNING and a
    failure record quote it: a message of several lines (torch's ``Error(s) in loading
    state_dict for Net:`` followed by each key and its shapes) says what went wrong only
    in full. Blank lines dropped; at most ``FULL_REASON_CHARS`` characters."""
    text = "\n".join(line.rstrip() for line in client_text(reason).splitlines() if line.strip())
    if len(text) <= FULL_REASON_CHARS:
        return text
    return f"{text[:FULL_REASON_CHARS]}… ({len(text) - FULL_REASON_CHARS} more characters)"


# what a ClientApp's error says when the arrays it was sent do not load into its model (torch's
# load_state_dict, or a shape error of the client's own loading)
LOAD_ERROR = re.compile(r"state_dict|size mismatch|Missing key|Unexpected key|shape mismatch", re.IGNORECASE)


def is_profile(content: RecordDict) -> bool:
    """Whether a reply to the profile probe is a clusterfed client's profile (its client
    record lists its capabilities), not a stock ClientApp's evaluation."""
    client = content.get(protocol.CLIENT) if hasattr(content, "get") else None
    return client is not None and protocol.CAPABILITIES_KEY in client


def stock_key(content: RecordDict, node: int) -> str:
    """The key of a stock ClientApp from its evaluate reply: a ``client`` ConfigRecord's
    ``client-key``, else a ``client-key`` or ``partition-id`` (a whole number) in its metrics
    or in any ConfigRecord of the reply (a ``config`` record, say), else ``node-<node id>``."""
    client = content.get(protocol.CLIENT) if hasattr(content, "get") else None
    if client is not None and str(client.get("client-key", "")).strip():
        return str(client["client-key"])
    records = [content.get(protocol.METRICS)] if hasattr(content, "get") else []
    records += [record for _, record in sorted(getattr(content, "config_records", {}).items())]
    for record in records:
        for name in STOCK_KEY_METRICS:
            value = record.get(name) if record is not None else None
            if isinstance(value, (int, float)) and not isinstance(value, bool) and float(value).is_integer():
                return str(int(value))
    return f"{STOCK_KEY_PREFIX}{node}"
