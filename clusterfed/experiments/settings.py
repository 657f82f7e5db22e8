"""The one registry of named settings: a setting is a named dict of run-config keys (data set,
partitioner and its keys, clients, participation) that every experiment file, ``clusterfed
experiment`` and every benchmark script takes from here.

Names are ``<data set>-<partition>`` with a ``-<clients>`` and ``-frac<p>`` suffix where they
differ from the 20-client, full-participation default. The MNIST settings read the
10,000-digit MNIST subset in torchvision's layout from ``data-dir`` (the folder holding
``MNIST/raw``); the default is ``shared/data`` in the repository's parent folder
(:func:`default_data_dir`), and an experiment's ``data-dir`` or ``clusterfed experiment
--data-dir`` replaces it.

The 10,000-client settings use ``synthetic-digits``, 120,000 8×8 images generated from
scikit-learn's digits (no files): the real data sets on hand hold too few samples for 10,000
clients (digits 1,797, the MNIST subset 10,000).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from clusterfed.datasets.sources import EMBEDDED

PAIRS = "0,1;2,3;4,5;6,7;8,9"
ROTATIONS = "0,90,180,270"

# the partitions, by their short name (data-independent keys)
PARTITIONS: dict[str, dict[str, Any]] = {
    "pairs": {"partitioner": "label-groups", "label-groups": PAIRS},
    "shards": {"partitioner": "shards"},
    "label-swap": {"partitioner": "label-swap", "num-groups": 4},
    "rotation": {"partitioner": "rotation", "rotations": ROTATIONS},
    "dominant": {"partitioner": "dominant", "num-groups": 4, "alpha": 0.8},
    "dirichlet": {"partitioner": "dirichlet", "beta": 0.1},
    "iid": {"partitioner": "iid"},
}

SCALE_CLIENTS = (200, 400, 1000)
SCALE_FRACTIONS = (1.0, 0.1)
GENERATED_SCALE_CLIENTS = 10_000


def default_data_dir() -> Path:
    """``shared/data`` beside the repository (where CI and this workplace keep ``MNIST/raw``)."""
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


def _sampled(fraction: float) -> dict[str, float]:
    """A cross-device round samples who trains and who is evaluated alike."""
    return {"fraction-train": fraction, "fraction-evaluate": fraction}


def _build() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, keys in PARTITIONS.items():
        out[f"digits-{name}"] = {"dataset": "digits", "num-clients": 20, **keys}
    # four digit pairs (8 digits): 20 clients (IFCA's comparisons), and the client-selection
    # paper's setting, 8 clients (a pair of digits per two clients); two pairs on 3 clients
    # (the deployment measurements' small federation)
    four_pairs = {"dataset": "digits", "partitioner": "label-groups", "label-groups": "0,1;2,3;4,5;6,7"}
    out["digits-four-pairs"] = {**four_pairs, "num-clients": 20}
    out["digits-four-pairs-8"] = {**four_pairs, "num-clients": 8}
    out["digits-two-pairs-3"] = {"dataset": "digits", "partitioner": "label-groups", "label-groups": "0,1;2,3",
                                 "num-clients": 3}
    # the benchmarks' own federations: four pairs on 12 clients (the evidence upload's bytes) and
    # on 100, three pairs on 12 (secure aggregation's cost), label swap over three groups on 12
    # clients (IFCA's re-seeding)
    out["digits-four-pairs-12"] = {**four_pairs, "num-clients": 12}
    out["digits-four-pairs-100"] = {**four_pairs, "num-clients": 100}
    out["digits-three-pairs-12"] = {"dataset": "digits", "partitioner": "label-groups", "label-groups": "0,1;2,3;4,5",
                                    "num-clients": 12}
    out["digits-label-swap3-12"] = {"dataset": "digits", "partitioner": "label-swap", "num-groups": 3,
                                    "num-clients": 12}
    mnist = {"dataset": "mnist", "data-dir": str(default_data_dir())}
    for name in ("rotation", "pairs"):
        out[f"mnist-{name}"] = {**mnist, "num-clients": 20, **PARTITIONS[name]}
    # scale: 200 / 400 / 1,000 clients on the 10,000-digit subset (50 / 25 / 10 samples each)
    for clients in SCALE_CLIENTS:
        for name in ("rotation", "pairs"):
            for fraction in SCALE_FRACTIONS:
                suffix = "" if fraction == 1.0 else f"-frac{fraction:g}"
                out[f"mnist-{name}-{clients}{suffix}"] = {
                    **mnist, "num-clients": clients, **PARTITIONS[name], **_sampled(fraction), "min-samples": 5}
    # 10,000 clients of 12 generated images (about 10 to train, 2 to test) for speed and memory
    for name in ("rotation", "pairs"):
        for fraction in SCALE_FRACTIONS:
            suffix = "" if fraction == 1.0 else f"-frac{fraction:g}"
            out[f"synthetic-{name}-{GENERATED_SCALE_CLIENTS}{suffix}"] = {
                "dataset": "synthetic-digits", "num-clients": GENERATED_SCALE_CLIENTS, **PARTITIONS[name],
                **_sampled(fraction), "min-samples": 5}
    return out


SETTINGS: dict[str, dict[str, Any]] = _build()

# the short names benchmark scripts took before the registry (``--settings rotation,label-groups``)
SHORT_NAMES: dict[str, str] = {**{name: f"digits-{name}" for name in PARTITIONS}, "label-groups": "digits-pairs"}


class UnknownSetting(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


def setting_name(name: str) -> str:
    """The registry name for ``name`` (a registry name or a short name)."""
    if name in SETTINGS:
        return name
    if name in SHORT_NAMES:
        return SHORT_NAMES[name]
    close = difflib.get_close_matches(name, [*SETTINGS, *SHORT_NAMES], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UnknownSetting(f"unknown setting {name!r}{hint}; registered: {', '.join(SETTINGS)}")


def setting(name: str) -> dict[str, Any]:
    """A copy of the setting's run-config keys."""
    return dict(SETTINGS[setting_name(name)])


def uses_data_dir(values: dict[str, Any]) -> bool:
    return values.get("dataset", "digits") not in EMBEDDED
