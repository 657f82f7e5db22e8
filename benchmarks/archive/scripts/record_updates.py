"""Record every client's update of every round under FedAvg dynamics (one cluster, no
split), per named layer, for offline study of split rules.

    python benchmarks/archive/scripts/record_updates.py --setting rotation --seed 0 --rounds 50 --out /tmp/rec [--set key=value ...]

Runs ``cfl`` with splitting disabled (so the dynamics are FedAvg's) and writes
``<out>/<setting>_s<seed>.npz``: ``<layer>`` arrays of shape (rounds, clients, size)
(float32; a named layer's weight and bias flattened together), ``groups`` (true group per
client), ``keys`` and ``num_examples``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from benchmarks.grid import SETTINGS  # noqa: E402
from clusterfed.config import parse_config, parse_overrides  # noqa: E402
from clusterfed.simulation import simulate  # noqa: E402
from clusterfed.strategies.cfl import CFL  # noqa: E402

STORE: dict = {}


def consider_split(self, server_round, cluster, replies, decision):
    layers: dict[str, list[str]] = {}
    for name in self.all_names:
        layers.setdefault(name.rsplit(".", 1)[0], []).append(name)
    STORE.setdefault("layers", layers)
    STORE.setdefault("clients", self.clients)
    STORE.setdefault("round_vectors", []).append({
        r.key: {layer: np.concatenate([np.asarray(r.update[n], dtype=np.float32).ravel() for n in names])
                for layer, names in layers.items()} for r in replies})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--setting", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--tag", default="")
    p.add_argument("--out", default="/tmp/rec")
    a = p.parse_args()
    CFL.consider_split = consider_split
    values = {"num-clients": 20, "rounds": a.rounds, "seed": a.seed, **SETTINGS[a.setting],
              **parse_overrides(a.overrides), "strategy": "cfl", "min-split-round": 1,
              "out-dir": f"/tmp/rec_runs/{a.setting}{a.tag}_s{a.seed}"}
    summary = simulate(parse_config(values), engine="inprocess", stream=None)
    rv = STORE["round_vectors"]
    keys = sorted(rv[0], key=lambda k: int(''.join(c for c in k if c.isdigit()) or 0))
    out = {layer: np.stack([np.stack([r[k][layer] for k in keys]) for r in rv]) for layer in STORE["layers"]}
    clients = STORE["clients"]
    out["groups"] = np.array([str(clients[k].true_group) for k in keys])
    out["keys"] = np.array(keys)
    out["num_examples"] = np.array([clients[k].num_examples for k in keys])
    Path(a.out).mkdir(parents=True, exist_ok=True)
    np.savez_compressed(f"{a.out}/{a.setting}{a.tag}_s{a.seed}.npz", **out)
    print(a.setting, a.seed, "acc", summary["final_accuracy"], {l: out[l].shape for l in STORE["layers"]})


if __name__ == "__main__":
    main()
