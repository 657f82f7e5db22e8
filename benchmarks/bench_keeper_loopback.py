"""The run keeper against a real SuperLink on 127.0.0.1, without containers: a TLS SuperLink
(``--database``) and 2 SuperNodes, a FedAvg run started by ``clusterfed keep``'s loop
(``clusterfed.keeper.Keeper`` with the `flwr` CLI), and the SuperLink killed with SIGKILL
after round 2 and started again on the same database after a few seconds (what a restart
policy does). Nobody re-runs `flwr run`: the keeper must see the run die, end what is left of
it, relaunch it with ``resume-from="auto"`` and see it to its end.

Every second the bench samples out-dir/status.json and the ServerApp processes of this
federation, and checks that status.json told the truth at each sample:

- it says ``running`` only while rounds arrive within the keeper's stall bound (plus one poll);
- after the kill it leaves ``running`` (``stalled`` or ``resuming``, with a reason) before the
  resumed run records its next round;
- at most one ServerApp process of this federation is alive at any sample;
- it ends ``finished``, with every round in rounds.jsonl exactly once.

Writes OUT/result.json and OUT/manifest.json.

    PYTHONPATH=$PWD:$PWD/tests python benchmarks/bench_keeper_loopback.py --out benchmarks/results/keeper-loopback
"""

from __future__ import annotations

import argparse
import json
import signal
import tempfile
import threading
from dataclasses import asdict
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from benchmarks.bench_deploy_scale import nodes_up  # noqa: E402
from benchmarks.bench_deployment import overrides  # noqa: E402
from clusterfed.experiments.manifest import start_manifest, write_manifest  # noqa: E402
from clusterfed.keeper import FlwrCli, Keeper, Policy, read_rounds  # noqa: E402
from clusterfed.keeper.audit import audit  # noqa: E402
from test_deployment import FLWR, Federation, wait_for  # noqa: E402

SUPERLINK_DOWN_SECONDS = 3.0


def serverapps(port: int) -> list[int]:
    """The live ServerApp processes of the federation on ``port`` (zombies excluded)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            state = (proc / "stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and any(Path(a).name == "flwr-serverapp" for a in argv[:2]) and \
                any(str(port) in a for a in argv):
            found.append(int(proc.name))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--kill-after", type=int, default=2, help="kill the SuperLink once this round is recorded")
    parser.add_argument("--timeout", type=float, default=30.0, help="the run's timeout (seconds per exchange)")
    parser.add_argument("--poll", type=float, default=3.0, help="the keeper's poll (seconds)")
    args = parser.parse_args()
    manifest = start_manifest(vars(args))
    with tempfile.TemporaryDirectory(prefix="keeper-loopback-") as folder:
        tmp = Path(folder)
        result = run(tmp, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    write_manifest(out, manifest)
    print(json.dumps(result["verdict"], indent=1))
    return 0 if all(result["verdict"].values()) else 1


def run(tmp: Path, args: argparse.Namespace) -> dict:
    from clusterfed.cli import main as cli_main

    parts, out = tmp / "parts", tmp / "out"
    assert cli_main(["partition", "--out", str(parts), "--set", "num-clients=2", "--set", "dataset=\"digits\"",
                     "--set", "partitioner=\"label-groups\"", "--set", "label-groups=\"0-4;5-9\""]) == 0
    config = {"strategy": "fedavg", "num-clients": 2, "min-clients": 2, "rounds": args.rounds,
              "timeout": args.timeout, "wait-timeout": 60.0, "absent-after": 2, "out-dir": str(out)}
    policy = Policy(rounds=args.rounds, round_timeout=args.timeout, wait_timeout=60.0, backoff=5.0,
                    start_timeout=120.0, max_retries=5)
    federation = Federation(tmp)
    federation.env["CLUSTERFED_POLL_SECONDS"] = "0.5"
    log_lines: list[str] = []
    samples: list[dict] = []
    started = time.monotonic()
    events: list[dict] = []

    def event(kind: str, **fields) -> None:
        events.append({"kind": kind, "t": round(time.monotonic() - started, 1), **fields})
        print(f"[{events[-1]['t']:6.1f}s] {kind} {fields}", flush=True)

    try:
        federation.start_superlink("--database", str(tmp / "state.db"))
        superlink = federation.processes[-1]
        for i in range(2):
            federation.start_node(f"dev-{i}", parts / f"part-{i}.npz")
        wait_for(lambda: nodes_up(federation) >= 2, 300, "2 SuperNodes online", poll=2.0)
        event("nodes online")
        flower = FlwrCli(str(ROOT), "test", overrides(config), flwr=FLWR, env=federation.env)
        keeper = Keeper(flower, out, policy, log=lambda line: (log_lines.append(line), print(line, flush=True)))
        code: list[int] = []
        thread = threading.Thread(target=lambda: code.append(keeper.run(args.poll)), daemon=True)
        thread.start()
        kill_at = None
        deadline = time.monotonic() + 1500
        while thread.is_alive() and time.monotonic() < deadline:
            status = json.loads((out / "status.json").read_text()) if (out / "status.json").exists() else {}
            sample = {"t": round(time.monotonic() - started, 1), "status": status.get("status"),
                      "round": read_rounds(out).last, "serverapps": len(serverapps(federation.port)),
                      "reason": status.get("reason", status.get("error", ""))[:160]}
            if not samples or (sample["status"], sample["round"], sample["serverapps"]) != \
                    (samples[-1]["status"], samples[-1]["round"], samples[-1]["serverapps"]):
                print(f"[{sample['t']:6.1f}s] sample {sample}", flush=True)
            samples.append(sample)
            if kill_at is None and sample["round"] >= args.kill_after:
                kill_at = sample["t"]
                Federation.stop(superlink, signal.SIGKILL)  # the SuperLink alone, as in its container
                event("superlink killed (SIGKILL)", round=sample["round"], serverapps_alive=sample["serverapps"])
                time.sleep(SUPERLINK_DOWN_SECONDS)
                superlink = federation.spawn(superlink.args, "superlink-restarted")
                federation.wait_for_superlink()
                event("superlink restarted on the same database")
            time.sleep(1.0)
        thread.join(timeout=5)
    finally:
        federation.close()
    rounds = read_rounds(out)
    final = json.loads((out / "status.json").read_text())
    checks = audit(samples, policy, args.poll, kill_at if kill_at is not None else 1e9)
    verdict = {
        "keeper_exit_0": code == [0],
        "status_finished": final.get("status") == "finished",
        "every_round_once": sorted(rounds.rounds) == list(range(1, args.rounds + 1)) and not rounds.duplicates,
        "superlink_killed": kill_at is not None,
        "relaunched_without_a_person": final.get("keeper", {}).get("relaunches", 0) >= 1,
        "never_running_beyond_the_stall_bound": checks["running_beyond_the_stall_bound"] == 0,
        "left_running_after_the_kill": checks["left_running_after_the_kill"],
        "at_most_one_serverapp": checks["most_serverapps_alive_at_once"] <= 1,
    }
    left = checks["first_status_after_the_kill_that_is_not_running"]
    checks["seconds_from_the_kill_to_a_status_that_is_not_running"] = (
        round(left["t"] - kill_at, 1) if left and kill_at is not None else None)
    return {"config": config, "policy": asdict(policy),
            "superlink_kills": 1 if kill_at is not None else 0, "rounds_recorded": len(set(rounds.rounds)),
            "final_status": final, "checks": checks, "verdict": verdict, "events": events, "keeper_log": log_lines,
            "samples": samples, "wall_seconds": round(time.monotonic() - started, 1)}


if __name__ == "__main__":
    raise SystemExit(main())
