"""A chaos soak on 127.0.0.1: a deployed federation under node kills, SuperLink kills and a
device whose data turns bad, compared with a clean run of the same seed.

For each strategy (default FedClust and CFL) on the built-in digits data (``digits-four-pairs``
with ``--nodes`` clients: four true groups):

* **clean**: the same partitions, client keys, run config and seed, run through the same
  ServerApp code (``run_server``) on the in-process grid, which gives the same numbers as a
  deployment (``bench_deployment.py`` shows equal accuracy and ARI) at a fraction of the CPU;
* **chaos**: a TLS SuperLink with ``--enable-supernode-auth`` and ``--database``, every device
  with its own registered EC key, ``client-key`` and ``data-path``, and ``flwr run`` with
  ``resume-from="auto"`` (``test_deployment.Federation`` starts and stops everything). While
  it runs, from a seeded schedule:

  - after every ``--kill-every``-th round, SIGKILL ``ceil(--kill-fraction × nodes)`` random
    SuperNodes; restart them (same key, same data) once the next round is recorded;
  - after rounds ``rounds // 3`` and ``2 * rounds // 3``, SIGKILL the SuperLink with its
    SuperExec and ServerApp, restart it on the same database and start ``flwr run`` again:
    the ServerApp resumes from out-dir's checkpoint;
  - after round ``rounds // 2``, one device's data file is replaced by one whose images are
    NaN (its loader refuses it: every later message of that device fails, named).

  After every kill the checkpoint is loaded with ``clusterfed.runner.checkpoint.load_checkpoint``
  (the ServerApp may be writing it at that moment: a complete old or new one must be there).

Checks, written to ``summary.json``: rounds.jsonl holds rounds 1..R once each; every
checkpoint check passed; every failure entry in rounds.jsonl names its client and a reason,
and every device killed or broken is named in a failure, an absence or status.json; the
final accuracy differs from the clean run's by at most 2 pp; the final assignments agree
(ARI between clean and chaos). Figures: accuracy per round (clean vs chaos) and the devices
present (evaluated) per round, with the events marked.

    PYTHONPATH=$PWD:$PWD/tests python benchmarks/bench_chaos_soak.py --nodes 12 --rounds 30 \\
        --out benchmarks/results/chaos-soak
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import signal
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from benchmarks.bench_deploy_scale import nodes_up  # noqa: E402
from benchmarks.bench_deployment import overrides  # noqa: E402
from clusterfed.experiments.manifest import start_manifest, write_manifest  # noqa: E402
from clusterfed.experiments.settings import setting  # noqa: E402
from test_deployment import FLWR, Federation, rows, wait_for  # noqa: E402
from test_deployment_auth import _device_key  # noqa: E402

SETTING = "digits-four-pairs"
SUPERLINK_DOWN_SECONDS = 3.0  # how long the SuperLink stays down before its restart


def partition(folder: Path, nodes: int, seed: int) -> tuple[dict, dict[str, int]]:
    from clusterfed.cli import main as cli_main

    data = {**setting(SETTING), "num-clients": nodes, "seed": seed}
    settings = sum((["--set", f"{k}={json.dumps(v) if isinstance(v, str) else v}"] for k, v in data.items()), [])
    assert cli_main(["partition", "--out", str(folder), *settings]) == 0
    manifest = json.loads((folder / "manifest.json").read_text())
    return data, {f"dev-{i}": c["true-group"] for i, c in enumerate(manifest["clients"])}


def run_config(data: dict, strategy: str, rounds: int, out: Path, nodes: int, timeout: float) -> dict:
    return {**data, "strategy": strategy, "rounds": rounds, "batch-size": 32, "device": "cpu", "checkpoint": True,
            "timeout": timeout, "out-dir": str(out)}


def clean_run(parts: Path, config: dict, nodes: int) -> None:
    """The run without chaos: the ServerApp's own code on the in-process grid, with the
    deployment's client keys and data files."""
    from flwr.supercore.task_identity import TaskIdentity

    from clusterfed.client_app import app as client_app
    from clusterfed.config import parse_config
    from clusterfed.runner.inprocess import InProcessGrid
    from clusterfed.server_app import run_server

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    configs = [{"client-key": f"dev-{i}", "data-path": str(parts / f"part-{i}.npz")} for i in range(nodes)]
    grid = InProcessGrid(client_app, nodes, node_configs=configs)
    run_server(grid, parse_config(config), stream=None, node_wait_seconds=0)


def schedule(rounds: int, nodes: int, kill_every: int, kill_fraction: float, seed: int) -> dict:
    """The seeded chaos: which SuperNodes die after which round, when the SuperLink dies,
    which device's data turns bad and when."""
    rng = random.Random(seed)
    superlink_kills = sorted({max(1, rounds // 3), max(2, 2 * rounds // 3)})
    bad_round = max(1, rounds // 2)
    keys = [f"dev-{i}" for i in range(nodes)]
    bad_device = rng.choice(keys)
    per_kill = max(1, math.ceil(kill_fraction * nodes))
    node_kills = {}
    for after in range(kill_every, rounds - 1, kill_every):
        if after in superlink_kills:  # one event per round boundary: the SuperLink's kill is enough there
            continue
        node_kills[after] = sorted(rng.sample([k for k in keys if k != bad_device], per_kill),
                                   key=lambda k: int(k.split("-")[1]))
    return {"node_kills": node_kills, "superlink_kills": superlink_kills, "bad_data": {"round": bad_round,
                                                                                      "client": bad_device}}


def verify_checkpoint(out: Path) -> dict:
    from clusterfed.runner.checkpoint import CheckpointError, load_checkpoint

    try:
        state = load_checkpoint(out)
    except (CheckpointError, OSError) as error:
        return {"ok": False, "error": str(error)}
    return {"ok": True, "round": int(state["round"])}


def spoil(path: Path) -> None:
    """The device's data turns bad: same arrays, images all NaN (written beside, then renamed)."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    arrays["x_train"] = np.full(arrays["x_train"].shape, np.nan, dtype=np.float32)
    arrays["x_test"] = np.full(arrays["x_test"].shape, np.nan, dtype=np.float32)
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)


def last_round(out: Path) -> int:
    records = rows(out)
    return records[-1]["round"] if records else 0


def chaos_run(tmp: Path, parts: Path, config: dict, plan: dict, nodes: int, deadline: float) -> dict:
    """The deployed run under ``plan``; returns the events as they happened."""
    out = Path(config["out-dir"])
    keys = tmp / "keys"
    federation = Federation(tmp)
    federation.env["CLUSTERFED_POLL_SECONDS"] = "0.5"
    federation.env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = "0.1"
    events, checks = [], []
    started = time.monotonic()
    rounds = int(config["rounds"])

    def event(kind: str, **fields) -> None:
        events.append({"kind": kind, "after_round": last_round(out), "t": round(time.monotonic() - started, 1),
                       **fields})
        print(f"[{events[-1]['t']:7.1f}s] {kind} {fields}", flush=True)

    def node(key: str) -> None:
        federation.start_node(key, parts / f"{key.replace('dev-', 'part-')}.npz", 'warm-worker="auto"',
                              extra_args=("--auth-supernode-private-key", str(keys / key)))

    try:
        federation.start_superlink("--enable-supernode-auth", "--database", str(tmp / "state.db"))
        superlink = federation.processes[-1]
        superlink_args = superlink.args
        for i in range(nodes):
            answer = federation.flwr("supernode", "register", str(_device_key(keys, f"dev-{i}")) + ".pub", "test",
                                     "--format", "json")
            assert answer.returncode == 0, answer.stdout + answer.stderr
        for i in range(nodes):
            node(f"dev-{i}")
        wait_for(lambda: nodes_up(federation) >= nodes, 300, f"{nodes} SuperNodes online", poll=2.0)
        event("all nodes online")

        def start_run(name: str):
            return federation.spawn([FLWR, "run", str(ROOT), "test", "--stream", "--run-config", overrides(config)],
                                    name)

        run = start_run("flwr-run")
        pending_restart: dict[int, list[str]] = {}
        done_kills, superlink_kills_done, bad_done = set(), set(), False
        while time.monotonic() < deadline:
            now = last_round(out)
            if run.poll() is not None and now >= rounds:
                break
            if run.poll() is not None:  # ended, and not by a kill of ours (a kill starts the next run)
                event("flwr run ended early", rc=run.returncode)
                break
            for after, killed in list(pending_restart.items()):
                if now >= after + 1:
                    for key in killed:
                        node(key)
                    event("nodes restarted", clients=killed)
                    del pending_restart[after]
            for after, victims in plan["node_kills"].items():
                if now >= after and after not in done_kills:
                    done_kills.add(after)
                    for key in victims:
                        Federation.stop(federation.nodes[key], signal.SIGKILL)
                    check = verify_checkpoint(out)
                    checks.append({"after": "node kill", **check})
                    event("nodes killed", clients=victims, checkpoint=check)
                    pending_restart[now] = victims
            if not bad_done and now >= plan["bad_data"]["round"]:
                bad_done = True
                client = plan["bad_data"]["client"]
                spoil(parts / f"{client.replace('dev-', 'part-')}.npz")
                event("data turned bad", client=client)
            for after in plan["superlink_kills"]:
                if now >= after and after not in superlink_kills_done:
                    superlink_kills_done.add(after)
                    federation.kill_superlink(superlink)
                    run.wait(timeout=120)
                    check = verify_checkpoint(out)
                    checks.append({"after": "superlink kill", **check})
                    event("superlink killed", checkpoint=check, rounds_in_file=last_round(out))
                    time.sleep(SUPERLINK_DOWN_SECONDS)
                    superlink = federation.spawn(superlink_args, f"superlink-restart-{len(superlink_kills_done)}")
                    federation.wait_for_superlink()
                    run = start_run(f"flwr-run-resumed-{len(superlink_kills_done)}")
                    event("superlink restarted, flwr run resumed")
            time.sleep(1.0)
        else:
            event("deadline reached: run stopped")
            federation.kill_superlink(superlink)  # with its ServerApp, which close() would not stop
        if run.poll() is None:
            run.wait(timeout=max(10.0, deadline - time.monotonic()))
    finally:
        federation.close()
    checks.append({"after": "end", **verify_checkpoint(out)})
    return {"events": events, "checkpoint_checks": checks, "wall_seconds": round(time.monotonic() - started, 1)}


def rounds_accounted(records: list[dict], rounds: int) -> dict:
    seen = [r["round"] for r in records]
    return {"rounds_in_file": len(seen), "missing": sorted(set(range(1, rounds + 1)) - set(seen)),
            "duplicates": sorted({r for r in seen if seen.count(r) > 1}),
            "in_order": seen == sorted(seen)}


def failures_named(records: list[dict], status: dict, run: dict) -> dict:
    """Every failure entry names a client and a reason; every device the chaos hit is named."""
    entries = [f for r in records for f in r.get("failed", []) + r.get("rejections", [])]
    # named: the client key (else at least the node id) and a reason
    unnamed = [f for f in entries if (f.get("client") is None and f.get("node") is None) or not f.get("reason")]
    node_only = [f for f in entries if f.get("client") is None and f.get("node") is not None]
    named = {f["client"] for f in entries if f.get("client")}
    absent = {a["client"] for r in records for a in r.get("absent", []) if a.get("client")}
    in_status = {d["client"] for d in status.get("failing", []) + status.get("absent", []) if d.get("client")}
    hit = {k for e in run["events"] if e["kind"] == "nodes killed" for k in e["clients"]}
    bad = [e["client"] for e in run["events"] if e["kind"] == "data turned bad"]
    bad_reasons = sorted({f["reason"] for f in entries if bad and f.get("client") == bad[0]})
    by_kind: dict[str, int] = {}
    for f in entries:
        by_kind[f.get("kind", "?")] = by_kind.get(f.get("kind", "?"), 0) + 1
    return {"failure_entries": len(entries), "by_kind": by_kind, "unnamed": len(unnamed),
            "named_by_node_only": len(node_only), "node_only_reasons": sorted({f["reason"] for f in node_only})[:3],
            "killed_devices": sorted(hit, key=lambda k: int(k.split("-")[1])),
            "killed_devices_not_named": sorted(hit - named - absent - in_status),
            "bad_device": bad[0] if bad else None,
            "bad_device_named": bool(bad) and bad[0] in (named | in_status),
            "bad_device_reasons": bad_reasons[:3],
            "status_failing": status.get("failing", []), "status_absent": status.get("absent", [])}


def compare(clean_out: Path, chaos_out: Path, rounds: int, run: dict) -> dict:
    """The chaos run against the clean one at the last round the chaos run recorded (the
    planned last round unless the soak was stopped by ``--max-minutes``)."""
    from sklearn.metrics import adjusted_rand_score

    clean, chaos = rows(clean_out), rows(chaos_out)
    status = json.loads((chaos_out / "status.json").read_text()) if (chaos_out / "status.json").exists() else {}
    reached = chaos[-1]["round"] if chaos else 0
    clean_at = next((r for r in clean if r["round"] == reached), None)
    # the rows carry each round's assignment; clusters.json (the last round's) where they do not
    assignments = {name: (row.get("assignment") or json.loads((out / "clusters.json").read_text())["assignment"])
                   if row and (row.get("assignment") or (out / "clusters.json").exists()) else {}
                   for name, row, out in (("clean", clean_at, clean_out), ("chaos", chaos[-1] if chaos else None,
                                                                           chaos_out))}
    common = sorted(set(assignments["clean"]) & set(assignments["chaos"]))
    ari = (float(adjusted_rand_score([assignments["clean"][k] for k in common],
                                     [assignments["chaos"][k] for k in common])) if len(common) > 1 else None)
    final = {"clean": clean_at["accuracy"] if clean_at else None, "chaos": chaos[-1]["accuracy"] if chaos else None}
    # the chaos run's mean is over the devices it evaluated (not the broken one): the clean
    # run's mean over the same devices separates lost training from a smaller population
    present = sorted(chaos[-1]["client_accuracy"]) if chaos else []
    clean_same = (float(np.mean([clean_at["client_accuracy"][k] for k in present])) if clean_at and present
                  and all(k in clean_at["client_accuracy"] for k in present) else None)
    # each cluster's accuracy and members at that round: where the chaos run lost accuracy
    final_clusters = {name: {str(c): {"accuracy": v["accuracy"], "members": sorted(
        (k for k, a in assignments[name].items() if str(a) == str(c)), key=lambda k: int(k.split("-")[1]))}
        for c, v in row["clusters"].items()} if row else {}
        for name, row in (("clean", clean_at), ("chaos", chaos[-1] if chaos else None))}
    accounted = {**rounds_accounted(chaos, reached), "planned": rounds, "reached": reached}
    delta = (None if None in final.values() else round(100 * (final["chaos"] - final["clean"]), 2))
    delta_same = None if clean_same is None or final["chaos"] is None else round(100 * (final["chaos"] - clean_same), 2)
    named = failures_named(chaos, status, run)
    checks_ok = all(c["ok"] for c in run["checkpoint_checks"])
    verdict = {
        "every_round_once": not accounted["missing"] and not accounted["duplicates"] and accounted["in_order"],
        "checkpoint_never_corrupt": checks_ok,
        "every_failure_named": named["unnamed"] == 0 and not named["killed_devices_not_named"]
        and named["bad_device_named"],
        "accuracy_within_2pp": delta is not None and abs(delta) <= 2.0,
        "same_clusters": ari == 1.0,
        "completed": status.get("status") == "ok" and reached == rounds,
    }
    return {"status": status.get("status"), "status_ended": status.get("ended"), "status_note": status.get("note"),
            "final_accuracy_clean": final["clean"], "final_accuracy_chaos": final["chaos"],
            "accuracy_delta_pp": delta, "compared_at_round": reached,
            "final_accuracy_clean_same_devices": clean_same, "accuracy_delta_same_devices_pp": delta_same,
            "assignment_ari_clean_vs_chaos": ari, "final_clusters": final_clusters,
            "final_ari_true_groups_clean": clean_at["ari"] if clean_at else None,
            "final_ari_true_groups_chaos": chaos[-1]["ari"] if chaos else None,
            "rounds": accounted, "checkpoint_checks": run["checkpoint_checks"], "failures": named,
            "events": run["events"], "chaos_wall_seconds": run["wall_seconds"], "checks": verdict,
            "all_checks_pass": all(verdict.values()),
            "per_round": {name: [{"round": r["round"], "accuracy": r["accuracy"], "clients_evaluated":
                                  r["clients_evaluated"], "clients_known": r["clients_known"],
                                  "clients_absent": r["clients_absent"], "failures": r["failures"],
                                  "num_clusters": r["num_clusters"]} for r in recs]
                          for name, recs in (("clean", clean), ("chaos", chaos))}}


def without_paths(value, tmp_root: Path):
    """``value`` with every path under ``tmp_root`` (the run's scratch folder) cut to its file
    name, so that the summary speaks of ``part-6.npz``, not of a temporary folder."""
    if isinstance(value, dict):
        return {k: without_paths(v, tmp_root) for k, v in value.items()}
    if isinstance(value, list):
        return [without_paths(v, tmp_root) for v in value]
    if isinstance(value, str):
        return re.sub(re.escape(str(tmp_root).rstrip("/")) + r"/(?:[^/\s'\":]+/)*([^/\s'\":]+)", r"\1", value)
    return value


def figures(results: dict, folder: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    names = list(results)
    fig, axes = plt.subplots(2, len(names), figsize=(5.5 * len(names), 6.5), squeeze=False, sharex="col")
    for col, name in enumerate(names):
        res = results[name]
        acc, present = axes[0][col], axes[1][col]
        for run, style in (("clean", "-"), ("chaos", "--")):
            recs = res["per_round"][run]
            acc.plot([r["round"] for r in recs], [r["accuracy"] for r in recs], style, label=run)
        chaos = res["per_round"]["chaos"]
        present.step([r["round"] for r in chaos], [r["clients_evaluated"] for r in chaos], where="mid",
                     label="evaluated")
        present.step([r["round"] for r in chaos], [r["clients_known"] for r in chaos], where="mid", linestyle=":",
                     label="known, not absent")
        for e in res["events"]:
            colour = {"nodes killed": "tab:red", "superlink killed": "black", "data turned bad": "tab:purple"}.get(
                e["kind"])
            if colour:
                for ax in (acc, present):
                    ax.axvline(e["after_round"] + 0.5, color=colour, alpha=0.35, linewidth=1)
        acc.set_title(f"{name}: accuracy (red: nodes killed, black: SuperLink killed, purple: bad data)",
                      fontsize=8)
        acc.set_ylabel("mean client accuracy")
        acc.legend(fontsize=8)
        present.set_ylabel("devices in the round (chaos run)")
        present.set_ylim(0, max(r["clients_known"] for r in chaos) + 1)
        present.yaxis.get_major_locator().set_params(integer=True)
        present.set_xlabel("round")
        present.legend(fontsize=8)
    fig.tight_layout()
    path = folder / "chaos-soak.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    made.append(path.name)
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--strategies", default="fedclust,cfl")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kill-every", type=int, default=4, help="SIGKILL SuperNodes after every k-th round")
    parser.add_argument("--kill-fraction", type=float, default=0.2)
    parser.add_argument("--timeout", type=float, default=120.0, help="run config timeout: seconds per phase")
    parser.add_argument("--max-minutes", type=float, default=17.0, help="per chaos run: stop it after this long")
    parser.add_argument("--tmp", default=None)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "chaos-soak"))
    parser.add_argument("--combine", nargs="+", metavar="FOLDER",
                        help="instead of running: merge the summary.json of these folders (one strategy each, "
                             "say run side by side) into --out, with the figure and a manifest")
    args = parser.parse_args()
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    if args.combine:
        combine([Path(f) for f in args.combine], folder)
        return
    tmp_root = Path(args.tmp or tempfile.mkdtemp(prefix="clusterfed-chaos-"))
    tmp_root.mkdir(parents=True, exist_ok=True)
    print(f"tmp: {tmp_root}", flush=True)
    plan = schedule(args.rounds, args.nodes, args.kill_every, args.kill_fraction, args.seed)
    manifest = start_manifest({k: v for k, v in vars(args).items() if k not in ("tmp", "out")})
    results = {}
    for strategy in args.strategies.split(","):
        tmp = tmp_root / strategy
        tmp.mkdir()
        data, _groups = partition(tmp / "parts", args.nodes, args.seed)
        clean_out, chaos_out = tmp / "clean", tmp / "out"
        clean_run(tmp / "parts", run_config(data, strategy, args.rounds, clean_out, args.nodes, args.timeout),
                  args.nodes)
        config = {**run_config(data, strategy, args.rounds, chaos_out, args.nodes, args.timeout),
                  "resume-from": "auto", "wait-timeout": 300.0,
                  "min-clients": args.nodes - max(1, math.ceil(args.kill_fraction * args.nodes)) - 1}
        run = chaos_run(tmp, tmp / "parts", config, plan, args.nodes, time.monotonic() + 60 * args.max_minutes)
        results[strategy] = {"run_config": {k: v for k, v in config.items() if k != "out-dir"},
                             **compare(clean_out, chaos_out, args.rounds, run)}
        print(json.dumps({k: v for k, v in results[strategy].items() if k not in ("per_round", "events")},
                         indent=1), flush=True)
    summary = {"setting": SETTING, "nodes": args.nodes, "rounds": args.rounds, "seed": args.seed,
               "tls": True, "supernode_auth": True,
               "clean_run": "the same ServerApp code (run_server) on the in-process grid, same data files and keys",
               "schedule": plan, "strategies": without_paths(results, tmp_root),
               "all_checks_pass": all(r["all_checks_pass"] for r in results.values())}
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    made = figures(results, folder)
    write_manifest(folder, manifest, outputs=["summary.json", *made])
    print(f"all checks pass: {summary['all_checks_pass']}")


def combine(parts: list[Path], folder: Path) -> None:
    """One summary (and figure) from runs of the same setting and schedule, one strategy each;
    the manifest lists the parts' manifests. Where a part's scratch folder (its ``--tmp``) is
    still there, its comparison is made again from the rounds on disk, so that the summary
    follows this version of ``compare``."""
    summaries = [json.loads((part / "summary.json").read_text()) for part in parts]
    for part, summary in zip(parts, summaries):
        command = json.loads((part / "manifest.json").read_text())["command"]
        scratch = Path(command[command.index("--tmp") + 1]) if "--tmp" in command else None
        for name, res in summary["strategies"].items():
            if scratch and (scratch / name / "out" / "rounds.jsonl").exists():
                run = {"events": res["events"], "checkpoint_checks": res["checkpoint_checks"],
                       "wall_seconds": res["chaos_wall_seconds"]}
                res.update(compare(scratch / name / "clean", scratch / name / "out", summary["rounds"], run))
    first = summaries[0]
    shared = ("setting", "nodes", "rounds", "seed", "schedule")
    for part, other in zip(parts, summaries):
        differ = [k for k in shared if other[k] != first[k]]
        if differ:
            raise SystemExit(f"{part}/summary.json differs from {parts[0]}/summary.json in {differ}: not one soak")
    # parts written before the summary was cleaned of paths: any path under the temp folder
    results = {name: without_paths(res, Path(tempfile.gettempdir())) for s in summaries
               for name, res in s["strategies"].items()}
    manifest = start_manifest({"combine": [str(part) for part in parts]})
    summary = {**first, "strategies": results, "all_checks_pass": all(r["all_checks_pass"] for r in results.values())}
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    made = figures(results, folder)
    runs = [json.loads((part / "manifest.json").read_text()) for part in parts]
    write_manifest(folder, manifest, outputs=["summary.json", *made], runs=runs)
    print(f"all checks pass: {summary['all_checks_pass']}")


if __name__ == "__main__":
    main()
