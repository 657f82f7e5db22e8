"""What secure aggregation costs a run: bytes each way and seconds per round, plain vs SecAgg+,
at 12 and 100 clients, one global group (FedAvg: all trainers in one protocol instance) vs one
group per cluster (FedClust: one instance per cluster after its clustering round), with the
final accuracy and ARI of both.

Every cell runs the ServerApp's own code (``run_server``) on the in-process grid, with the
built-in digits task and the same ClientApp for plain and secure runs (the built-in task with
``secagg_mod``, which passes plain train messages through untouched; the in-process engine's
batched training is off for both, since it does not run unknown mods). The grid counts every
message's content as Flower serialises it for the network (``recorddict_to_proto(...).ByteSize()``):
bytes down (server to clients) and up, per round, per message kind and per protocol stage.
Seconds per round are the round records' ``round_seconds`` (the server's wall time for the
round, clients included, one after another in this process). Plain and secure runs of a cell
run back to back and are compared as ratios (secure / plain): the machine's load changes
between cells more than within one.

    PYTHONPATH=$PWD python benchmarks/bench_secure_aggregation.py --out benchmarks/results/secure-aggregation
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from clusterfed.experiments.settings import setting

ROOT = Path(__file__).resolve().parents[1]

# clients -> (its setting in the registry, SecAgg+ shares: 0 = every member of the group holds shares)
SIZES = {12: ("digits-three-pairs-12", 0), 100: ("digits-four-pairs-100", 15)}
# strategy -> how its trainers are grouped for the protocol
GROUPING = {"fedavg": "one global group", "fedclust": "one group per cluster"}


def counting_grid():
    """InProcessGrid that counts the serialised bytes of every message each way."""
    from flwr.common.serde import recorddict_to_proto

    from clusterfed.runner.inprocess import InProcessGrid
    from clusterfed.secagg import wire

    class CountingGrid(InProcessGrid):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.bytes = defaultdict(lambda: defaultdict(int))  # round -> "down|up:kind" -> bytes
            self._kind: dict[str, str] = {}

        @staticmethod
        def kind(message) -> str:
            content = message.content if message.has_content() else None
            if content is not None and wire.RECORD in content:
                return f"secagg-{content[wire.RECORD].get('stage')}"
            return message.metadata.message_type

        def push_messages(self, messages):
            messages = list(messages)
            ids = list(super().push_messages(messages))
            for message in messages:
                kind = self.kind(message)
                self._kind[message.metadata.message_id] = kind
                self.bytes[message.metadata.group_id or "-"][f"down:{kind}"] += (
                    recorddict_to_proto(message.content).ByteSize())
            return ids

        def pull_messages(self, *args, **kwargs):
            replies = list(super().pull_messages(*args, **kwargs))
            for reply in replies:
                if reply.has_content():
                    kind = self._kind.get(reply.metadata.reply_to_message_id, reply.metadata.message_type)
                    self.bytes[reply.metadata.group_id or "-"][f"up:{kind}"] += (
                        recorddict_to_proto(reply.content).ByteSize())
            return replies

    return CountingGrid


def client_app():
    from clusterfed import faults
    from clusterfed.client import client_app as make
    from clusterfed.client_app import TASK
    from clusterfed.client_entry import check_node_data

    return make(TASK, mods=[faults.inject_faults], check=check_node_data, secure_aggregation=True)


def one_run(clients: int, strategy: str, secure: bool, rounds: int, out: Path, seed: int) -> dict:
    from flwr.supercore.task_identity import TaskIdentity

    from clusterfed.config import parse_config
    from clusterfed.runner.preflight import preflight
    from clusterfed.server_app import run_server
    from test_deployment import rows

    name, shares = SIZES[clients]
    config = {**setting(name), "seed": seed, "strategy": strategy, "rounds": rounds, "batch-size": 32,
              "device": "cpu", "checkpoint": False, "out-dir": str(out), "fedclust.cluster-epochs": 2,
              "secure-aggregation": "secaggplus" if secure else "off"}
    if secure and shares:
        config["secagg-shares"] = shares
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    checked = preflight(parse_config(config))
    grid = counting_grid().for_run(client_app(), checked)
    started = time.perf_counter()
    run_server(grid, checked, stream=None, node_wait_seconds=0)
    wall = time.perf_counter() - started
    records = rows(out)
    per_round = []
    for record in records:
        counted = grid.bytes.get(str(record["round"]), {})
        per_round.append({
            "round": record["round"], "round_seconds": record.get("round_seconds"),
            "bytes_down": sum(v for k, v in counted.items() if k.startswith("down:")),
            "bytes_up": sum(v for k, v in counted.items() if k.startswith("up:")),
            "by_kind": dict(sorted(counted.items())),
            "num_clusters": record.get("num_clusters"), "secure_aggregation": record.get("secure_aggregation")})
    training = per_round[1:] if strategy == "fedclust" else per_round  # FedClust's round 1 clusters, in the clear
    clusters = json.loads((out / "clusters.json").read_text()) if (out / "clusters.json").exists() else {}
    return {"clients": clients, "strategy": strategy, "grouping": GROUPING[strategy], "secure": secure,
            "secagg_shares": shares if secure else None, "rounds": rounds, "run_config": config,
            "wall_seconds": round(wall, 2), "final_accuracy": records[-1]["accuracy"], "final_ari": records[-1]["ari"],
            "assignment": clusters.get("assignment"), "num_clusters": records[-1].get("num_clusters"),
            "training_rounds": [r["round"] for r in training],
            "seconds_per_training_round": statistics.mean(r["round_seconds"] for r in training),
            "bytes_down_per_training_round": statistics.mean(r["bytes_down"] for r in training),
            "bytes_up_per_training_round": statistics.mean(r["bytes_up"] for r in training),
            "per_round": per_round}


def compare_pair(plain: dict, secure: dict) -> dict:
    from sklearn.metrics import adjusted_rand_score

    same = sorted(set(plain["assignment"] or {}) & set(secure["assignment"] or {}))
    ari = (float(adjusted_rand_score([plain["assignment"][k] for k in same], [secure["assignment"][k] for k in same]))
           if len(same) > 1 else None)
    return {
        "clients": plain["clients"], "strategy": plain["strategy"], "grouping": plain["grouping"],
        "secagg_shares": secure["secagg_shares"],
        "bytes_down_ratio": secure["bytes_down_per_training_round"] / plain["bytes_down_per_training_round"],
        "bytes_up_ratio": secure["bytes_up_per_training_round"] / plain["bytes_up_per_training_round"],
        "seconds_ratio": secure["seconds_per_training_round"] / plain["seconds_per_training_round"],
        "plain": {k: plain[k] for k in ("bytes_down_per_training_round", "bytes_up_per_training_round",
                                        "seconds_per_training_round", "final_accuracy", "final_ari", "num_clusters")},
        "secure": {k: secure[k] for k in ("bytes_down_per_training_round", "bytes_up_per_training_round",
                                          "seconds_per_training_round", "final_accuracy", "final_ari", "num_clusters")},
        "accuracy_delta": secure["final_accuracy"] - plain["final_accuracy"],
        "ari_delta": secure["final_ari"] - plain["final_ari"],
        "assignment_ari_plain_vs_secure": ari,
        "same_accuracy_and_ari": abs(secure["final_accuracy"] - plain["final_accuracy"]) <= 0.005
        and secure["final_ari"] == plain["final_ari"] and ari in (None, 1.0),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="12,100")
    parser.add_argument("--strategies", default="fedavg,fedclust")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "secure-aggregation")
    args = parser.parse_args()
    from clusterfed.experiments.manifest import start_manifest, write_manifest

    manifest = start_manifest({k: str(v) for k, v in vars(args).items() if k != "out"})
    runs, pairs = [], []
    with tempfile.TemporaryDirectory(prefix="clusterfed-secagg-bench-") as tmp:
        for clients in (int(c) for c in args.clients.split(",")):
            for strategy in args.strategies.split(","):
                pair = {}
                for secure in (False, True):
                    out = Path(tmp) / f"{clients}-{strategy}-{'secure' if secure else 'plain'}"
                    run = one_run(clients, strategy, secure, args.rounds, out, args.seed)
                    print(json.dumps({k: v for k, v in run.items() if k not in ("per_round", "assignment",
                                                                                "run_config")}), flush=True)
                    runs.append(run)
                    pair["secure" if secure else "plain"] = run
                pairs.append(compare_pair(pair["plain"], pair["secure"]))
                print(json.dumps(pairs[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"rounds": args.rounds, "seed": args.seed,
               "sizes": {str(k): {"label_groups": setting(name)["label-groups"], "secagg_shares": s}
                         for k, (name, s) in SIZES.items()},
               "pairs": pairs, "by": {f"{p['strategy']}_{p['clients']}": p for p in pairs},
               "all_same_accuracy_and_ari": all(p["same_accuracy_and_ari"] for p in pairs)}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (args.out / "runs.json").write_text(json.dumps(runs, indent=1) + "\n")
    write_manifest(args.out, manifest, outputs=["summary.json", "runs.json"])
    print(f"same accuracy and ARI in every pair: {summary['all_same_accuracy_and_ari']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
