"""A client's stable key: it survives reconnects, Flower's node ids do not."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import lru_cache

from flwr.supercore import log

from clusterfed.datasets.device_data import data_fingerprint


def client_key(node_config: Mapping) -> str:
    """The node config's ``client-key``; without one, a device with a ``data-path`` is keyed by
    its data's fingerprint (with a warning) and a partition by its ``partition-id``."""
    if "client-key" in node_config:
        return str(node_config["client-key"])
    data_path = str(node_config.get("data-path", ""))
    if data_path:
        return data_key(data_path)
    if "partition-id" in node_config:
        return str(int(node_config["partition-id"]))
    raise ValueError("node config has no 'client-key' (nor a 'data-path' or 'partition-id' to derive one from): "
                     "start the SuperNode with --node-config 'client-key=\"site-3\"'")


@lru_cache(maxsize=8)
def data_key(data_path: str) -> str:
    key = f"data-{data_fingerprint(data_path)[:16]}"
    log(logging.WARNING, "node config has no 'client-key': using %s, derived from the hash of %s; set "
        "client-key in --node-config to keep the key when the data changes", key, data_path)
    return key
