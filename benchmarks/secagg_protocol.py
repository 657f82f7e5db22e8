"""Seconds and bytes per client per stage of the SecAgg+ protocol pieces (clusterfed.secagg),
for one group of 4, 12 and 100 members, with a model the size of the built-in digits CNN.

Each member is a stock Message-API ClientApp with ``secagg_mod``; its train function returns
the model it was sent plus a small offset (no training, so only the protocol is timed). The
server side is one ``GroupProtocol``. Every message goes through Flower's protobuf
serialisation both ways, in one process (no network): wire bytes are those serialised
contents; payload bytes are the protocol's own count (``GroupProtocol.ledger``). Seconds per
client are the ClientApp call (the mod's work; the stub train function takes microseconds);
server seconds are ``GroupProtocol``'s own work per stage. For comparison, a plain FedAvg round
sends each member one train message and gets one reply.

    PYTHONPATH=$PWD python benchmarks/secagg_protocol.py --out benchmarks/results/secagg-protocol
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.supercore.task_identity import TaskIdentity

from clusterfed.secagg import GroupProtocol, SecAggSettings, secagg_mod, wire

# (members, shares: None = every member; the 100-member group uses SecAgg+ neighbourhoods)
CASES = ((4, None), (12, None), (100, 15))


def digits_cnn() -> dict[str, np.ndarray]:
    import torch  # only here: the model's shapes and initial weights

    from clusterfed.models.cnns import DigitsCNN

    torch.manual_seed(0)
    return {name: value.numpy().copy() for name, value in DigitsCNN().state_dict().items()}


def client_app() -> ClientApp:
    app = ClientApp(mods=[secagg_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        rng = np.random.default_rng(context.node_id)
        arrays = {n: a.numpy() + rng.normal(0, 0.01, a.shape).astype(np.float32) for n, a in msg.content["arrays"].items()}
        return Message(RecordDict({"arrays": ArrayRecord({n: Array(a) for n, a in arrays.items()}),
                                   "metrics": MetricRecord({"num-examples": 50 + context.node_id % 50,
                                                            "train-loss": 0.5})}), reply_to=msg)

    return app


def over_the_wire(content: RecordDict) -> tuple[RecordDict, int]:
    data = recorddict_to_proto(content).SerializeToString()
    proto = type(recorddict_to_proto(RecordDict()))()
    proto.ParseFromString(data)
    return recorddict_from_proto(proto), len(data)


def one_group(size: int, shares: int | None, model: dict[str, np.ndarray], drop: int | None) -> dict:
    """Run the four stages; ``drop``: the index of a member that does not answer the collect stage."""
    app, keys = client_app(), [f"c{i:03d}" for i in range(size)]
    contexts = {k: Context(run_id=1, node_id=i, node_config={}, state=RecordDict(), run_config={})
                for i, k in enumerate(keys)}
    protocol = GroupProtocol(keys, SecAggSettings(shares=shares), session="bench", seed=0)
    train = RecordDict({"arrays": ArrayRecord({n: Array(a) for n, a in model.items()}),
                        "config": ConfigRecord({"server-round": 1})})
    stages: dict[str, dict] = {}
    for stage in wire.STAGES:
        seconds, down, up, replies = [], [], [], {}
        for key, ask in protocol.asks().items():
            content, sent = over_the_wire(wire.ask_content(ask, train if stage == wire.COLLECT else None))
            down.append(sent)
            if drop is not None and stage == wire.COLLECT and key == keys[drop]:
                continue
            message = Message(content, dst_node_id=contexts[key].node_id, message_type=MessageType.TRAIN)
            started = time.perf_counter()
            reply = app(message, contexts[key])
            seconds.append(time.perf_counter() - started)
            received, size_up = over_the_wire(reply.content)
            up.append(size_up)
            replies[key] = wire.reply_from_content(received)
        protocol.take(replies)
        ledger = protocol.ledger
        stages[stage] = {
            "client_seconds_median": statistics.median(seconds), "client_seconds_max": max(seconds),
            "server_seconds": ledger.seconds[stage],
            "wire_bytes_down_per_client": int(statistics.median(down)),
            "wire_bytes_up_per_client": int(statistics.median(up)),
            "payload_bytes_down_per_client": int(statistics.median(ledger.down[stage].values())),
            "payload_bytes_up_per_client": int(statistics.median(ledger.up[stage].values())),
        }
    result = protocol.result()
    return {"members": size, "shares": protocol.plan.shares, "threshold": protocol.plan.threshold,
            "dropped_at_collect": drop is not None, "completed": len(result.members),
            "total_weight": result.total_weight, "stages": stages}


def plain_round(model: dict[str, np.ndarray]) -> dict:
    """Wire bytes of one plain FedAvg train message and its reply, for comparison."""
    down = over_the_wire(RecordDict({"arrays": ArrayRecord({n: Array(a) for n, a in model.items()}),
                                     "config": ConfigRecord({"server-round": 1})}))[1]
    up = over_the_wire(RecordDict({"arrays": ArrayRecord({n: Array(a) for n, a in model.items()}),
                                   "metrics": MetricRecord({"num-examples": 50, "train-loss": 0.5})}))[1]
    return {"wire_bytes_down_per_client": down, "wire_bytes_up_per_client": up}


README = """# SecAgg+ protocol pieces: seconds and bytes per client per stage

What secure aggregation inside one group of clients costs, stage by stage, measured on the
protocol pieces alone (`clusterfed.secagg`: the client mod `secagg_mod` and the server's
`GroupProtocol`), for groups of 4, 12 and 100 members. The model is the built-in digits CNN
({parameters} float32 values in {arrays} arrays). Each member is a stock Message-API ClientApp
with `secagg_mod` added; its train function returns the model it was sent plus a small offset
(no training: only the protocol is timed). Every message goes through Flower's protobuf
serialisation both ways, in one process; there is no network, so no latency is included.

    PYTHONPATH=$PWD python benchmarks/secagg_protocol.py --out benchmarks/results/secagg-protocol

Settings: the defaults of `SecAggSettings` (threshold two thirds of a member's shares, clipping
range 8, 2**24 quantization steps, modulus 2**64, weights by `num-examples`). Groups of 4 and 12
share each member's secrets with every member (SecAgg's complete graph); the group of 100 uses
SecAgg+ neighbourhoods of {shares100} (`SecAggSettings(shares={shares100})`). Each group ran twice:
all members answering, and one member not answering the collect stage (it dropped after the
key exchange: the server rebuilds its pairwise masks from its neighbours' shares).

Columns, per client: seconds of the ClientApp call (median, and the slowest member), the
server's own seconds for the stage (`GroupProtocol`'s work for the whole group), and the bytes
of the serialised message contents down (server to client) and up. The collect stage's message
also carries the model (the train message a plain round sends anyway). The machine: see
`manifest.json` (two cores shared with other work while this ran: load average
{load_start} at the start; read seconds as upper bounds).

{table}

A plain FedAvg round, for comparison: {plain_down} bytes down and {plain_up} bytes up per client.

What it shows:

- The upload is about twice a plain reply: the masked vector is one unsigned 64-bit integer
  per value (the modulus 2**64), where the plain reply sends float32. A modulus of at most 2**32
  sends 32-bit integers (the plain size) but must hold members × max weight × quantization
  steps, so it needs far fewer steps or a small max weight.
- The key exchange grows with the neighbourhood, not with the group: a member of the group of
  100 sends and receives about as much as one of the group of 12.
- The server's unmask stage dominates at 100 members: rebuilding each survivor's mask seed
  from its Shamir shares (Flower's `combine_shares`, pycryptodome's pure-Python field
  arithmetic) is done once per member; a dropout adds one more rebuild (of its mask key) and
  its pairwise masks.

Files: `secagg_protocol.json` (every number above, per stage), `manifest.json` (commit,
versions, machine, command). This README is written by the script from the JSON
(`--readme-only` rewrites it without measuring).
"""


def table(summary: dict) -> str:
    lines = ["| members | shares / threshold | dropout | stage | client s (median / max) | server s | "
             "bytes down | bytes up |", "|---|---|---|---|---|---|---|---|"]
    for group in summary["groups"]:
        for stage, row in group["stages"].items():
            lines.append(
                f"| {group['members']} | {group['shares']} / {group['threshold']} | "
                f"{'one' if group['dropped_at_collect'] else 'none'} | {stage} | "
                f"{row['client_seconds_median']:.3f} / {row['client_seconds_max']:.3f} | {row['server_seconds']:.3f} | "
                f"{row['wire_bytes_down_per_client']} | {row['wire_bytes_up_per_client']} |")
    return "\n".join(lines)


def write_readme(out: Path) -> None:
    summary = json.loads((out / "secagg_protocol.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    shares100 = next(g["shares"] for g in summary["groups"] if g["members"] == 100)
    (out / "README.md").write_text(README.format(
        parameters=summary["model"]["parameters"], arrays=summary["model"]["arrays"], shares100=shares100,
        load_start=manifest["machine"]["load_average_start"][0], table=table(summary),
        plain_down=summary["plain_fedavg_round"]["wire_bytes_down_per_client"],
        plain_up=summary["plain_fedavg_round"]["wire_bytes_up_per_client"]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--readme-only", action="store_true", help="rewrite README.md from the JSON, measure nothing")
    args = parser.parse_args()
    if args.readme_only:
        write_readme(args.out)
        return 0
    from clusterfed.experiments.manifest import start_manifest, write_manifest

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    model = digits_cnn()
    config = {"cases": CASES, "settings": SecAggSettings().model_dump(), "model": "digits-cnn",
              "parameters": int(sum(a.size for a in model.values())), "arrays": len(model)}
    manifest = start_manifest(config)
    rows = []
    for size, shares in CASES:
        for drop in (None, size // 2):
            started = time.perf_counter()
            row = one_group(size, shares, model, drop)
            row["wall_seconds"] = time.perf_counter() - started
            print(json.dumps({k: v for k, v in row.items() if k != "stages"}), flush=True)
            rows.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {"model": config, "plain_fedavg_round": plain_round(model), "groups": rows}
    (args.out / "secagg_protocol.json").write_text(json.dumps(summary, indent=1) + "\n")
    write_manifest(args.out, manifest)
    write_readme(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
