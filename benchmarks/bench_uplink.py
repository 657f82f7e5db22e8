"""Clustering-round uplink: partial weights (the layer FedClust / AdaCFL ask for) versus
full weights, per client and for the round.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_uplink.py [--data-dir DIR-HOLDING-MNIST/raw] [--clients 20] [--no-run]

Computed from the model's state dict for LeNet-5 (MNIST, 28x28, 10 classes) and, for
reference, the digits CNN; then confirmed with two one-round FedClust runs of LeNet-5 on
MNIST from ``--data-dir`` (``cluster-layers = final`` and ``all``), whose measured
``clustering_bytes_up`` (the sum of the array bytes of every clustering reply) must equal
layer bytes × replying clients. Writes benchmarks/results/partial_uplink.json.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent

from clusterfed.config import parse_config  # noqa: E402
from clusterfed.datasets.shapes import DATASET_SHAPES  # noqa: E402
from clusterfed.experiments.settings import setting  # noqa: E402
from clusterfed.models import build_model, select_layers  # noqa: E402
from clusterfed.training import state_to_numpy  # noqa: E402

DEFAULT_DATA_DIR = ROOT.parent.parent / "shared" / "data"


def layer_sizes(model: str, dataset: str) -> dict:
    shape, num_classes = DATASET_SHAPES[dataset]
    state = state_to_numpy(build_model(model, dataset, shape, num_classes, 0))
    full = sum(a.nbytes for a in state.values())
    out = {"model": model, "dataset": dataset, "full_bytes": full, "full_parameters": sum(a.size for a in state.values())}
    for rule in ("final", "smallest-fc"):
        keys = select_layers(state, rule)
        partial = sum(state[k].nbytes for k in keys)
        out[rule] = {"layers": keys, "bytes": partial, "full_over_partial": round(full / partial, 2),
                     "fraction": round(partial / full, 5)}
    return out


def measured_run(data_dir: Path, clients: int, layers: str) -> dict:
    """One round of FedClust (1 clustering epoch: bytes do not depend on it)."""
    from clusterfed.simulation import simulate

    with tempfile.TemporaryDirectory() as out:
        config = parse_config({**setting("mnist-pairs"), "strategy": "fedclust", "model": "lenet5",
                               "data-dir": str(data_dir), "num-clients": clients, "rounds": 1,
                               "cluster-epochs": 1, "cluster-layers": layers, "fraction-evaluate": 0.0,
                               "batch-size": 32, "out-dir": out})
        started = time.perf_counter()
        simulate(config, engine="inprocess", stream=None)
        record = json.loads((Path(out) / "rounds.jsonl").read_text().splitlines()[0])
        replying = len(json.loads((Path(out) / "clusters.json").read_text())["client_order"])
    return {"cluster-layers": layers, "replying_clients": replying, "clustering_bytes_up": record["clustering_bytes_up"],
            "per_client_bytes": record["clustering_bytes_up"] / replying, "seconds": round(time.perf_counter() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="folder holding MNIST/raw")
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--no-run", action="store_true", help="only compute from the model sizes")
    args = parser.parse_args(argv)

    result = {
        "command": "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "computed": [layer_sizes("lenet5", "mnist"), layer_sizes("digits-cnn", "digits")],
    }
    lenet = result["computed"][0]
    if not args.no_run:
        partial, full = measured_run(args.data_dir, args.clients, "final"), measured_run(args.data_dir, args.clients, "all")
        result["measured_lenet5_mnist"] = {
            "partial": partial,
            "full": full,
            "full_over_partial": round(full["clustering_bytes_up"] / partial["clustering_bytes_up"], 2),
            # the counter must agree exactly with layer bytes × replying clients
            "partial_matches_model_sizes": partial["clustering_bytes_up"] == lenet["final"]["bytes"] * partial["replying_clients"],
            "full_matches_model_sizes": full["clustering_bytes_up"] == lenet["full_bytes"] * full["replying_clients"],
        }
    path = ROOT / "results" / "partial_uplink.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    for sizes in result["computed"]:
        print(f"{sizes['model']:>11}: full {sizes['full_bytes']:>7} B, final layer {sizes['final']['bytes']:>5} B "
              f"({sizes['final']['full_over_partial']}x less), smallest-fc {sizes['smallest-fc']['bytes']} B")
    if "measured_lenet5_mnist" in result:
        m = result["measured_lenet5_mnist"]
        print(f"measured, {args.clients} clients: partial {m['partial']['clustering_bytes_up']} B, full "
              f"{m['full']['clustering_bytes_up']} B, ratio {m['full_over_partial']}x; matches sizes: "
              f"{m['partial_matches_model_sizes']} / {m['full_matches_model_sizes']}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
