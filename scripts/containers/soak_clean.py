"""The container soak's clean twin: the same devices' data files (before one was spoiled), client
keys and run config, run through the ServerApp's own code on the in-process grid, and the soak's
last round compared with it. Needs torch, so scripts/test-containers.sh runs it in the server
image (the host needs none):

    python scripts/containers/soak_clean.py DATA SOAK_FOLDER > clean.json

SOAK_FOLDER holds the soak run's files as test-containers.sh copies them: run-rounds.jsonl,
run-clusters.json, run-config.json (the ServerApp's flat run config).

Prints JSON (exit 1 unless within 2 points with the same clusters): the clean run's accuracy at the soak's last round over the devices the soak
evaluated there, the soak's, the difference in points, and the ARI between the two runs'
assignments (clusters.json's ``assignment`` of each)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path


def clean_rows(data: Path, config: dict, devices: int, out: Path) -> list[dict]:
    from flwr.supercore.task_identity import TaskIdentity

    from clusterfed.client_app import app as client_app
    from clusterfed.config import parse_config
    from clusterfed.runner.inprocess import InProcessGrid
    from clusterfed.server_app import run_server

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    configs = [{"client-key": f"device-{n}", "data-path": str(data / f"part-{n - 1}.npz")}
               for n in range(1, devices + 1)]
    grid = InProcessGrid(client_app, devices, node_configs=configs)
    run_server(grid, parse_config({**config, "out-dir": str(out)}), stream=None, node_wait_seconds=0)
    return [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines() if line.strip()]


def main() -> int:
    from sklearn.metrics import adjusted_rand_score

    data, folder = Path(sys.argv[1]), Path(sys.argv[2])
    config = {**json.loads((folder / "run-config.json").read_text()), "resume-from": "", "checkpoint": False}
    soak = [json.loads(line) for line in (folder / "run-rounds.jsonl").read_text().splitlines() if line.strip()]
    devices = int(config["num-clients"])
    with tempfile.TemporaryDirectory() as temporary:
        out = Path(temporary)
        clean = clean_rows(data, config, devices, out)
        clean_assignment = json.loads((out / "clusters.json").read_text())["assignment"]
    last = soak[-1]
    twin = next(row for row in clean if row["round"] == last["round"])
    present = sorted(last["client_accuracy"])
    if not present:  # the soak's last round evaluated nobody: nothing to compare, and a failure
        print(json.dumps({"round": last["round"], "devices_compared": [], "soak_accuracy": None,
                          "within_2_pp_with_the_same_clusters": False,
                          "why": "the soak's last round evaluated no device"}, indent=1))
        return 1
    clean_same = sum(twin["client_accuracy"][key] for key in present) / len(present)
    soak_assignment = json.loads((folder / "run-clusters.json").read_text())["assignment"]
    common = sorted(set(clean_assignment) & set(soak_assignment))
    result = {
        "round": last["round"], "devices_compared": present,
        "soak_accuracy": last["accuracy"], "clean_accuracy_same_devices": round(clean_same, 4),
        "clean_accuracy_all_devices": twin["accuracy"],
        "difference_pp": round(100 * (last["accuracy"] - clean_same), 2),
        "ari_between_the_runs": float(adjusted_rand_score([clean_assignment[k] for k in common],
                                                          [soak_assignment[k] for k in common])),
        "clean_clusters": twin.get("num_clusters"), "soak_clusters": last.get("num_clusters"),
    }
    result["within_2_pp_with_the_same_clusters"] = abs(result["difference_pp"]) <= 2.0 and \
        result["ari_between_the_runs"] == 1.0
    print(json.dumps(result, indent=1))
    return 0 if result["within_2_pp_with_the_same_clusters"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
