"""The deployed secure-aggregation check: FedClust with SecAgg+ inside each cluster on a TLS
federation on 127.0.0.1, with one SuperNode killed between the key exchange and the masked upload.

The federation is ``bench_chaos_soak``'s (``test_deployment.Federation``): a TLS SuperLink with
``--enable-supernode-auth``, ``--nodes`` SuperNodes each with its own registered EC key,
``client-key`` and ``data-path`` (``clusterfed partition``: digits, two groups of two digits),
``flwr run`` with ``secure-aggregation = "secaggplus"``. The ClientApp is the built-in task with
``secagg_mod`` (``clusterfed.client_entry:app``, the app a device runs, wrapped by ``benchmarks/secagg_hold_app.py``)
and one test-only hook: the victim's node config names a stage and a round, and at the first
ask of that stage from that round on (default: the collect stage, the ask to upload the masked
vector, which comes after the device has sent its public keys and encrypted shares) the device
writes a marker and waits without answering. The check sees the marker and SIGKILLs the
victim's SuperNode (its process group, as ``bench_chaos_soak`` kills nodes) and the waiting
ClientApp process: the device is gone mid-protocol, its masked vector never sent. The server
must finish that round's secure sum of the victim's cluster from the survivors (rebuilding the
victim's pairwise masks from its neighbours' shares). Once the next round is recorded the victim
is restarted with the same key and data, as a repaired device would be.

The same run config without the kill (and without the hook) runs first on the in-process grid
(``bench_chaos_soak.clean_run``: the ServerApp's code, same data files and keys); the deployed
run is compared with it.

Checks (``summary.json``; ``all_checks_pass`` is their conjunction):
``completed`` (status ok, rounds 1..R once each), ``held_mid_protocol`` (the victim received the
stage's ask and was killed while holding it), ``kill_round_tolerated`` (the kill round is
recorded, its record names the victim, and the victim's cluster's protocol that round produced
a sum of at least 3 survivors with the victim among the dropped), ``same_clusters`` (final
assignment equal to the clean run's, ARI 1.0), ``accuracy_within_2pp`` (final mean accuracy
within 2 points of the clean run's) and ``secure_rounds`` (every round's record has its
clusters' secure-aggregation outcome: FedClust trains under it from round 1, after its
clustering request).

    PYTHONPATH=$PWD:$PWD/tests python benchmarks/bench_secagg_deployed.py --nodes 8 --rounds 5 \\
        --out benchmarks/results/secure-aggregation/deployed
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from benchmarks.bench_chaos_soak import clean_run, without_paths  # noqa: E402
from benchmarks.bench_deploy_scale import nodes_up  # noqa: E402
from benchmarks.bench_deployment import overrides  # noqa: E402
from clusterfed.experiments.manifest import start_manifest, write_manifest  # noqa: E402
from clusterfed.experiments.settings import setting  # noqa: E402
from test_deployment import FLWR, Federation, rows, wait_for  # noqa: E402
from test_deployment_auth import _device_key  # noqa: E402

# the registry's two-pair partition; the node count is the command line's
DATA = {k: v for k, v in setting("digits-two-pairs-3").items() if k != "num-clients"}
HOLD_MODULE = "secagg_hold_entry"


def partition(folder: Path, nodes: int, seed: int) -> tuple[dict, dict[str, int]]:
    from clusterfed.cli import main as cli_main

    data = {**DATA, "num-clients": nodes, "seed": seed}
    settings = sum((["--set", f"{k}={json.dumps(v) if isinstance(v, str) else v}"] for k, v in data.items()), [])
    assert cli_main(["partition", "--out", str(folder), *settings]) == 0
    manifest = json.loads((folder / "manifest.json").read_text())
    return data, {f"dev-{i}": c["true-group"] for i, c in enumerate(manifest["clients"])}


def run_config(data: dict, rounds: int, out: Path, timeout: float, nodes: int, secure: str = "secaggplus") -> dict:
    config = {**data, "strategy": "fedclust", "rounds": rounds, "batch-size": 32, "device": "cpu",
              "checkpoint": False, "timeout": timeout, "out-dir": str(out), "fedclust.cluster-epochs": 2,
              "min-clients": nodes - 1, "wait-timeout": 300.0}
    if secure != "off":  # "off": a dry run of the machinery (no protocol, so nothing is held)
        config["secure-aggregation"] = secure
    return config


def hold_app(folder: Path) -> Path:
    """An app folder for ``flwr run``: this repository's pyproject.toml (its run-config keys and
    defaults, its ServerApp) with the ClientApp swapped for the hold app. The bundle holds only
    that file and a one-line module; clusterfed itself is imported from PYTHONPATH, as in
    every loopback check here."""
    folder.mkdir(parents=True, exist_ok=True)
    text = (ROOT / "pyproject.toml").read_text()
    text, swapped = re.subn(r'(?m)^clientapp = ".*"$', f'clientapp = "{HOLD_MODULE}:app"', text)
    text, included = re.subn(r"(?m)^fab-include = .*$", 'fab-include = ["/*.py"]', text)
    assert swapped == 1 and included == 1, "pyproject.toml: no clientapp / fab-include line to swap"
    (folder / "pyproject.toml").write_text(text)
    # an assignment, not an import: ``flwr run`` finds the attribute by reading the module's source
    (folder / f"{HOLD_MODULE}.py").write_text('"""The deployed check\'s ClientApp."""\n'
                                              "from benchmarks.secagg_hold_app import app as _hold_app\n\n"
                                              "app = _hold_app\n")
    return folder


def deployed_run(tmp: Path, parts: Path, config: dict, nodes: int, victim: str, stage: str, kill_round: int,
                 deadline: float) -> dict:
    out = Path(config["out-dir"])
    keys, markers = tmp / "keys", tmp / "markers"
    markers.mkdir()
    app = hold_app(tmp / "app")
    federation = Federation(tmp)
    federation.env["CLUSTERFED_POLL_SECONDS"] = "0.5"
    federation.env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = "0.1"
    events: list[dict] = []
    started = time.monotonic()
    marker = markers / f"{victim}.held"

    def event(kind: str, **fields) -> None:
        records = rows(out)
        events.append({"kind": kind, "after_round": records[-1]["round"] if records else 0,
                       "t": round(time.monotonic() - started, 1), **fields})
        print(f"[{events[-1]['t']:7.1f}s] {kind} {fields}", flush=True)

    def node(key: str, hold: bool) -> None:
        extra = 'warm-worker="auto"'
        if hold:
            extra += f' hold-at-stage="{stage}" hold-from-round={kill_round} hold-marker="{marker}"'
        federation.start_node(key, parts / f"{key.replace('dev-', 'part-')}.npz", extra,
                              extra_args=("--auth-supernode-private-key", str(keys / key)))

    held = None
    try:
        federation.start_superlink("--enable-supernode-auth", "--database", str(tmp / "state.db"))
        for i in range(nodes):
            answer = federation.flwr("supernode", "register", str(_device_key(keys, f"dev-{i}")) + ".pub", "test",
                                     "--format", "json")
            assert answer.returncode == 0, answer.stdout + answer.stderr
        for i in range(nodes):
            node(f"dev-{i}", hold=f"dev-{i}" == victim)
        wait_for(lambda: nodes_up(federation) >= nodes, 300, f"{nodes} SuperNodes online", poll=2.0)
        event("all nodes online", nodes=nodes)
        run = federation.spawn([FLWR, "run", str(app), "test", "--stream", "--run-config", overrides(config)],
                               "flwr-run")
        restarted = False
        while time.monotonic() < deadline and run.poll() is None:
            if held is None and marker.exists():
                try:
                    held = json.loads(marker.read_text())
                except json.JSONDecodeError:  # being written
                    time.sleep(0.2)
                    continue
                Federation.stop(federation.nodes[victim], signal.SIGKILL)
                try:  # the ClientApp process that held the ask runs outside the SuperNode's group
                    os.kill(int(held["pid"]), signal.SIGKILL)
                except ProcessLookupError:
                    pass
                event("victim killed mid-protocol", client=victim, stage=held["stage"], round=held["round"],
                      session=held["session"])
            if held is not None and not restarted:
                records = rows(out)
                if records and held.get("round") is not None and records[-1]["round"] > held["round"]:
                    node(victim, hold=False)
                    restarted = True
                    event("victim restarted", client=victim)
            time.sleep(0.5)
        if run.poll() is None:
            event("deadline reached: run stopped")
            federation.kill_superlink(federation.processes[0])
        else:
            event("flwr run ended", rc=run.returncode)
    finally:
        federation.close()
    return {"events": events, "held": held, "wall_seconds": round(time.monotonic() - started, 1)}


def trained_clients(record: dict) -> set[str] | None:
    """The clients whose updates went into a round, where the record lists them."""
    for key in ("trained", "trainers", "sampled"):
        value = record.get(key)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return set(value)
    return None


def secure_info(record: dict) -> object:
    for key in ("secure_aggregation", "secagg", "secure-aggregation"):
        if key in record:
            return record[key]
    return None


def compare(clean_out: Path, deployed_out: Path, rounds: int, victim: str, run: dict) -> dict:
    from sklearn.metrics import adjusted_rand_score

    clean, deployed = rows(clean_out), rows(deployed_out)
    status = json.loads((deployed_out / "status.json").read_text()) if (deployed_out / "status.json").exists() else {}
    seen = [r["round"] for r in deployed]
    completed = status.get("status") == "ok" and seen == list(range(1, rounds + 1))
    assignments = {name: json.loads((out / "clusters.json").read_text())["assignment"]
                   if (out / "clusters.json").exists() else {} for name, out in (("clean", clean_out),
                                                                                   ("deployed", deployed_out))}
    common = sorted(set(assignments["clean"]) & set(assignments["deployed"]))
    ari = (float(adjusted_rand_score([assignments["clean"][k] for k in common],
                                     [assignments["deployed"][k] for k in common])) if len(common) > 1 else None)
    final = {"clean": clean[-1]["accuracy"] if clean else None, "deployed": deployed[-1]["accuracy"] if deployed else None}
    delta = None if None in final.values() else round(100 * (final["deployed"] - final["clean"]), 2)
    held = run["held"]
    kill_round = held.get("round") if held else None
    kill_record = next((r for r in deployed if r["round"] == kill_round), None)
    trained = trained_clients(kill_record) if kill_record else None
    # the victim's cluster in the kill round (the round's own assignment), and what its protocol did
    victim_cluster = (kill_record.get("assignment") or {}).get(victim) if kill_record else None
    if victim_cluster is None:
        victim_cluster = assignments["deployed"].get(victim)
    protocol = (secure_info(kill_record) or {}).get(str(victim_cluster)) if kill_record else None
    sum_from_survivors = (isinstance(protocol, dict) and "failed" not in protocol
                          and victim in (protocol.get("dropped") or {}) and int(protocol.get("members", 0)) >= 3)
    named = victim in json.dumps(kill_record) if kill_record else False
    secure = {r["round"]: secure_info(r) for r in deployed}
    checks = {
        "completed": completed,
        "held_mid_protocol": bool(held) and held.get("stage") == "collect"
        and any(e["kind"] == "victim killed mid-protocol" for e in run["events"]),
        "kill_round_tolerated": bool(kill_record) and (trained is None or victim not in trained) and named
        and sum_from_survivors,
        "same_clusters": ari == 1.0,
        "accuracy_within_2pp": delta is not None and abs(delta) <= 2.0,
        "secure_rounds": bool(secure) and all(secure.values()),
    }
    return {"status": status.get("status"), "status_note": status.get("note"), "rounds_recorded": seen,
            "held": held, "kill_round": kill_round, "kill_round_record": kill_record,
            "victim_cluster": victim_cluster, "victim_cluster_protocol_in_kill_round": protocol,
            "victim_cluster_summed_from_survivors": sum_from_survivors, "victim_named_in_kill_round": named,
            "final_accuracy_clean": final["clean"], "final_accuracy_deployed": final["deployed"],
            "accuracy_delta_pp": delta, "assignment_ari_clean_vs_deployed": ari,
            "final_ari_true_groups_clean": clean[-1]["ari"] if clean else None,
            "final_ari_true_groups_deployed": deployed[-1]["ari"] if deployed else None,
            "secure_aggregation_per_round": secure, "checks": checks,
            "all_checks_pass": all(checks.values()),
            "per_round": {name: [{k: r.get(k) for k in ("round", "accuracy", "ari", "clients_evaluated", "failures",
                                                         "num_clusters", "round_seconds", "bytes_up", "bytes_down")}
                                 for r in recs] for name, recs in (("clean", clean), ("deployed", deployed))},
            "events": run["events"], "deployed_wall_seconds": run["wall_seconds"]}


def _stop(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # the federation is closed on the way out


def main() -> None:
    signal.signal(signal.SIGTERM, _stop)  # SIGTERM stops the check and its federation
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=8, help="SuperNodes (two groups: at least 4 per cluster, so "
                        "that a cluster tolerates one dropout at the default threshold)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kill-round", type=int, default=3, help="the victim is held from this round on")
    parser.add_argument("--stage", default="collect", help="the protocol stage whose ask the victim holds")
    parser.add_argument("--victim", default=None, help="client key (default: the last device)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--secure-aggregation", default="secaggplus",
                        help='"off": a dry run of the federation and the app folder, with nothing to hold')
    parser.add_argument("--timeout", type=float, default=300.0, help="run config timeout: seconds per exchange")
    parser.add_argument("--max-minutes", type=float, default=25.0)
    parser.add_argument("--tmp", default=None)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "secure-aggregation" / "deployed"))
    args = parser.parse_args()
    if args.nodes < 6:
        raise SystemExit("--nodes: the check needs at least 6 SuperNodes")
    victim = args.victim or f"dev-{args.nodes - 1}"
    tmp = Path(args.tmp or tempfile.mkdtemp(prefix="clusterfed-secagg-deployed-"))
    tmp.mkdir(parents=True, exist_ok=True)
    print(f"tmp: {tmp}", flush=True)
    manifest = start_manifest({k: v for k, v in vars(args).items() if k not in ("tmp", "out")})
    data, groups = partition(tmp / "parts", args.nodes, args.seed)
    clean_out, deployed_out = tmp / "clean", tmp / "out"
    started = time.monotonic()
    clean_run(tmp / "parts", run_config(data, args.rounds, clean_out, args.timeout, args.nodes,
                                        args.secure_aggregation), args.nodes)
    clean_seconds = round(time.monotonic() - started, 1)
    config = run_config(data, args.rounds, deployed_out, args.timeout, args.nodes, args.secure_aggregation)
    run = deployed_run(tmp, tmp / "parts", config, args.nodes, victim, args.stage, args.kill_round,
                       time.monotonic() + 60 * args.max_minutes)
    result = compare(clean_out, deployed_out, args.rounds, victim, run)
    summary = {"nodes": args.nodes, "rounds": args.rounds, "seed": args.seed, "data": DATA, "true_groups": groups,
               "tls": True, "supernode_auth": True, "strategy": "fedclust", "secure_aggregation": args.secure_aggregation,
               "victim": victim, "hold_stage": args.stage, "hold_from_round": args.kill_round,
               "how_killed": "the victim's ClientApp holds the stage's ask (benchmarks/secagg_hold_app.py) and "
                             "writes a marker; the check SIGKILLs the victim's SuperNode process group and the "
                             "holding ClientApp process",
               "clean_run": "the same run config on the in-process grid (run_server), no kill",
               "clean_wall_seconds": clean_seconds,
               "run_config": {k: v for k, v in config.items() if k != "out-dir"}, **result}
    summary = without_paths(summary, tmp)
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for name in ("flwr-run.log",):
        log = tmp / "logs" / name
        if log.exists():
            shutil.copy(log, folder / name)
            (folder / name).write_text(without_paths((folder / name).read_text(errors="replace"), tmp))
    write_manifest(folder, manifest, outputs=["summary.json", "flwr-run.log"])
    print(json.dumps(summary["checks"], indent=1))
    print(f"all checks pass: {summary['all_checks_pass']}")
    if not summary["all_checks_pass"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
