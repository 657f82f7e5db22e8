"""The container soak's driver (scripts/test-containers.sh soak): while the run keeper runs
FedClust on the compose federation, break things on a schedule and sample what an operator
would see, with no human re-run.

    python scripts/containers/soak.py RESULTS VOLUME DATA --devices 6 --rounds 20 \\
        --kill-every 3 --superlink-kills 7,14 --bad-after 10 --out-name soak

- after every ``--kill-every``-th round, ``kill -9`` of one SuperNode container's process (the
  devices in turn; the engine's restart policy brings it back);
- after each round in ``--superlink-kills``, ``kill -9`` of the SuperLink container's process;
- after round ``--bad-after``, the last device's data file is overwritten in place with images
  that are all NaN (the bind mount keeps the file's inode, so it must be the same file);
- every 2 s: status.json and rounds.jsonl from the results volume (``VOLUME/<out-name>``), and the
  ``flwr-clientapp`` / ``flwr-serverapp`` processes in each of the project's containers (from
  /proc, matched to containers by their cgroup).

Writes RESULTS/summary.json (superlink_kills, rounds_recorded, final status, the truth checks,
process counts) and RESULTS/samples.jsonl. Exit 1 when a check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
PROJECT = "clusterfed"
APP_PROGRAMS = ("flwr-clientapp", "flwr-serverapp")


def podman(*args: str) -> str:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=120).stdout.strip()


def containers() -> dict[str, str]:
    """Service name -> full container id, for the project's containers (named
    ``clusterfed_<service>_1`` by podman-compose)."""
    lines = podman("ps", "--no-trunc", "--filter", f"label=io.podman.compose.project={PROJECT}",
                   "--format", "{{.ID}} {{.Names}}")
    out = {}
    for line in lines.splitlines():
        cid, _, name = line.partition(" ")
        if name.startswith(f"{PROJECT}_") and name.endswith("_1"):
            out[name[len(PROJECT) + 1:-2]] = cid
    return out


def app_processes(ids: dict[str, str]) -> dict[str, dict[str, int]]:
    """Per service: live and zombie Flower app processes (``flwr-clientapp``/``flwr-serverapp``)."""
    counts = {service: {"live": 0, "zombie": 0} for service in ids}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            cgroup = (proc / "cgroup").read_text()
            state = (proc / "stat").read_text().rpartition(")")[2].split()[0]
            name = (proc / "comm").read_text().strip()
        except (OSError, IndexError):
            continue
        service = next((s for s, cid in ids.items() if cid in cgroup), None)
        if service is None:
            continue
        if state == "Z" and name.startswith(("flwr-", "python", "flock")):
            counts[service]["zombie"] += 1
        elif any(Path(a).name in APP_PROGRAMS for a in argv[:2]) and not Path(argv[0]).name.endswith("sh"):
            counts[service]["live"] += 1  # the app itself, not the wrapper's shell on its way to flock
    return counts


def memory_mib() -> dict[str, float]:
    """Per service: memory in use now (`podman stats`), MiB."""
    out = {}
    units = {"b": 1 / 2**20, "kb": 1 / 1024, "kib": 1 / 1024, "mb": 1.0, "mib": 1.0, "gb": 1024.0, "gib": 1024.0}
    for line in podman("stats", "--no-stream", "--format", "{{.Name}} {{.MemUsage}}").splitlines():
        name, _, usage = line.partition(" ")
        number = usage.split("/")[0].strip().lower()
        value = number.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = number[len(value):].strip()
        if name.startswith(f"{PROJECT}_") and unit in units:
            out[name[len(PROJECT) + 1:-2]] = round(float(value) * units[unit], 1)
    return out


def crash(service: str, seconds: float = 120.0) -> float:
    """kill -9 the container's main process; seconds until the engine ran it again."""
    name = f"{PROJECT}_{service}_1"
    old = podman("inspect", "--format", "{{.State.Pid}}", name)
    os.kill(int(old), signal.SIGKILL)
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        new = podman("inspect", "--format", "{{.State.Pid}}", name)
        if new not in ("", "0", old):
            return round(time.monotonic() - t0, 1)
        time.sleep(1)
    raise RuntimeError(f"{service} was not restarted within {seconds:g} s after kill -9")


def kill_serverapp(ids: dict[str, str]) -> list[int]:
    """kill -9 the ServerApp processes (``flwr-serverapp``) in the serverapp container, not the
    container: the run's ServerApp dies and writes nothing more, as in an out-of-memory kill."""
    killed = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            cgroup = (proc / "cgroup").read_text()
        except OSError:
            continue
        if ids.get("serverapp", "-") in cgroup and any(Path(a).name == "flwr-serverapp" for a in argv[:2]) \
                and "flock" not in Path(argv[0]).name:
            os.kill(int(proc.name), signal.SIGKILL)
            killed.append(int(proc.name))
    return killed


def spoil_in_place(path: Path) -> None:
    """The device's data turns bad: same arrays, images all NaN, written into the same inode."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    for name in ("x_train", "x_test"):
        arrays[name] = np.full(arrays[name].shape, np.nan, dtype=np.float32)
    tmp = path.with_name("spoiled-" + path.name)  # np.savez adds .npz to a name without it
    np.savez(tmp, **arrays)
    with path.open("r+b") as target:
        target.write(tmp.read_bytes())
        target.truncate()
    tmp.unlink()


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def main() -> int:
    from clusterfed.keeper import Policy, read_rounds
    from clusterfed.keeper.audit import audit

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("volume", type=Path, help="the results volume's folder on the host")
    parser.add_argument("data", type=Path, help="docker/data")
    parser.add_argument("--devices", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--kill-every", type=int, default=3)
    parser.add_argument("--superlink-kills", default="7,14")
    parser.add_argument("--bad-after", type=int, default=10)
    parser.add_argument("--serverapp-kills", default="", help="rounds after which the ServerApp process is killed")
    parser.add_argument("--out-name", default="soak")
    parser.add_argument("--timeout", type=float, default=120.0, help="the run's timeout (for the stall bound)")
    parser.add_argument("--wait-timeout", type=float, default=300.0)
    parser.add_argument("--poll", type=float, default=10.0, help="the keeper's poll")
    parser.add_argument("--max-minutes", type=float, default=90.0)
    args = parser.parse_args()
    out = args.volume / args.out_name
    link_kills = [int(r) for r in args.superlink_kills.split(",") if r]
    node_kills = [r for r in range(args.kill_every, args.rounds, args.kill_every) if r not in link_kills]
    policy = Policy(rounds=args.rounds, round_timeout=args.timeout, wait_timeout=args.wait_timeout)
    args.results.mkdir(parents=True, exist_ok=True)
    events, samples, done = [], [], set()
    bad_device = args.devices
    t0 = time.monotonic()

    def act(kind: str, action, **fields) -> None:
        """Do one planned break; a failure is recorded as the event's error, the soak goes on."""
        try:
            fields.update(action() or {})
        except Exception as error:  # noqa: BLE001  (any failure of the harness itself is recorded)
            fields["error"] = f"{type(error).__name__}: {error}"
        event(kind, **fields)

    def event(kind: str, **fields) -> None:
        events.append({"kind": kind, "t": round(time.monotonic() - t0, 1), **fields})
        print(f"[{events[-1]['t']:7.1f}s] {kind} {fields}", flush=True)

    peak_memory: dict[str, float] = {}
    with (args.results / "samples.jsonl").open("w") as sample_file:
        while time.monotonic() - t0 < args.max_minutes * 60:
            if len(samples) % 30 == 0:  # about once a minute: podman stats is not free
                for service, mib in memory_mib().items():
                    kind = service.rsplit("-", 1)[0] if service[-1].isdigit() else service
                    peak_memory[kind] = max(peak_memory.get(kind, 0.0), mib)
            status, rounds = _json(out / "status.json"), read_rounds(out)
            processes = app_processes(containers())
            sample = {"t": round(time.monotonic() - t0, 1), "status": status.get("status"), "round": rounds.last,
                      "reason": str(status.get("reason", status.get("error", "")))[:200],
                      "live_app_processes": max((c["live"] for c in processes.values()), default=0),
                      "zombies": max((c["zombie"] for c in processes.values()), default=0),
                      "serverapps": processes.get("serverapp", {}).get("live", 0)}
            samples.append(sample)
            sample_file.write(json.dumps(sample) + "\n")
            sample_file.flush()
            if status.get("status") in ("finished", "failed") and status.get("keeper"):
                break
            for after in link_kills:
                if rounds.last >= after and ("link", after) not in done:
                    done.add(("link", after))
                    act("superlink kill -9", lambda: {"back_after_seconds": crash("superlink")},
                        after_round=rounds.last)
            for after in node_kills:
                if rounds.last >= after and ("node", after) not in done:
                    done.add(("node", after))
                    victim = f"supernode-{1 + len([k for k in done if k[0] == 'node']) % (args.devices - 1)}"
                    act("supernode kill -9", lambda: {"back_after_seconds": crash(victim)}, service=victim,
                        after_round=rounds.last)
            for after in [int(r) for r in args.serverapp_kills.split(",") if r]:
                if rounds.last >= after and ("serverapp", after) not in done:
                    done.add(("serverapp", after))
                    act("serverapp process kill -9", lambda: {"pids": kill_serverapp(containers())},
                        after_round=rounds.last)
            if rounds.last >= args.bad_after and ("bad", 0) not in done:
                done.add(("bad", 0))
                act("data turned bad", lambda: spoil_in_place(args.data / f"part-{bad_device - 1}.npz"),
                    device=f"device-{bad_device}", after_round=rounds.last)
            time.sleep(2.0)
        else:
            event("soak deadline reached")
    rounds = read_rounds(out)
    final = _json(out / "status.json")
    first_kill = next((e["t"] for e in events if e["kind"] == "superlink kill -9"), 1e9)
    checks = audit(samples, policy, args.poll, first_kill)
    rows = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines() if line.strip()] \
        if (out / "rounds.jsonl").exists() else []
    bad_key = f"device-{bad_device}"
    named = {f.get("client") for row in rows for f in row.get("failed", []) + row.get("rejections", [])} | \
        {d.get("client") for d in final.get("failing", []) + final.get("absent", []) if isinstance(d, dict)}
    summary = {
        "superlink_kills": sum(e["kind"] == "superlink kill -9" for e in events),
        "supernode_kills": sum(e["kind"] == "supernode kill -9" for e in events),
        "serverapp_kills": sum(e["kind"] == "serverapp process kill -9" for e in events),
        "rounds_planned": args.rounds, "rounds_recorded": len(set(rounds.rounds)),
        "duplicate_rounds": rounds.duplicates, "final_status": final,
        "final_accuracy": rows[-1].get("accuracy") if rows else None, "final_ari": rows[-1].get("ari") if rows else None,
        "bad_device": bad_key, "bad_device_named": bad_key in named,
        "most_live_app_processes_in_one_container": max(s["live_app_processes"] for s in samples),
        "most_zombies_in_one_container": max(s["zombies"] for s in samples),
        "peak_memory_mib_by_service_kind": peak_memory,
        "checks": checks, "events": events, "wall_seconds": round(time.monotonic() - t0, 1),
    }
    killed_app = next((e["t"] for e in events if e["kind"] == "serverapp process kill -9"), None)
    after_kill = next((x for x in samples if killed_app is not None and x["t"] >= killed_app
                       and x["status"] not in ("running", None)), None)
    summary["seconds_from_the_serverapp_kill_to_a_status_that_is_not_running"] = (
        round(after_kill["t"] - killed_app, 1) if after_kill else None)
    summary["verdict"] = {
        "finished": final.get("status") == "finished",
        "every_round_once": sorted(rounds.rounds) == list(range(1, args.rounds + 1)),
        "superlink_killed_twice": summary["superlink_kills"] == len(link_kills),
        "every_planned_break_done": not any("error" in e for e in events),
        "never_running_beyond_the_stall_bound": checks["running_beyond_the_stall_bound"] == 0,
        "at_most_one_serverapp": checks["most_serverapps_alive_at_once"] <= 1,
        "app_processes_bounded": summary["most_live_app_processes_in_one_container"] <= 3,
        "bad_device_named": summary["bad_device_named"],
        # the run is worth something: its last round evaluated every device but the broken one
        "last_round_evaluated_the_healthy_devices": bool(rows) and (rows[-1].get("clients_evaluated") or 0)
        >= args.devices - 1,
    }
    (args.results / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary["verdict"], indent=1))
    return 0 if all(summary["verdict"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
