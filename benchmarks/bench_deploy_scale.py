"""A deployed clustered run at scale on 127.0.0.1: N SuperNodes, and what the SuperLink and
the ServerApp cost in CPU and memory per node.

Partitions the built-in digits data for N clients (``label-groups`` "0,1;2,3;4,5;6,7;8,9":
five true groups), starts a TLS SuperLink and N SuperNodes (each with its ``client-key`` and
``data-path``; node config ``warm-worker`` as given, default ``false`` so that N devices do
not keep N ~550 MB warm workers on one machine), runs FedClust through ``flwr run --stream``
with ``min-clients=N``, and samples about every second, from /proc:

* the SuperLink's process tree (the ``flower-superlink`` process, its SuperExec and the
  ``flwr-serverapp`` process that starts): RSS (VmRSS) and CPU time (utime + stime);
* the ServerApp on its own (the process whose command line contains ``flwr-serverapp``);
* all SuperNodes' process trees together (each SuperNode, its SuperExec and ClientApp processes).

A tree is found by parent pid (Flower starts each SuperExec in a session of its own) plus
anything in the root's session; a process's CPU time is its last sampled value (a process
living less than one sample interval is missed, and CPU time is counted per process, not
from the parents' cutime).

    PYTHONPATH=$PWD:$PWD/tests python benchmarks/bench_deploy_scale.py --nodes 20 --rounds 3 \
        --out benchmarks/results/deploy_scale/n20.json

Writes the JSON given by --out (the markdown report is written by hand).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
import sys  # noqa: E402

from benchmarks.bench_deployment import overrides  # noqa: E402
from clusterfed.experiments.settings import setting  # noqa: E402
from test_deployment import FLWR, Federation, rows, wait_for  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
GROUPS = "0,1;2,3;4,5;6,7;8,9"


def processes() -> dict[int, dict]:
    """Every readable process: parent, session id, CPU seconds, RSS bytes and command line."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            rss = 0
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                    break
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue
        found[pid] = {"ppid": int(fields[1]), "session": int(fields[3]),
                      "cpu": (int(fields[11]) + int(fields[12])) / TICK, "rss": rss, "cmd": cmdline}
    return found


def pss(pid: int) -> int:
    """Proportional set size in bytes (shared pages, e.g. torch's libraries, split among the
    processes mapping them); 0 if the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def descendants(procs: dict[int, dict], roots: set[int]) -> dict[int, dict]:
    """The roots and every process below them (by parent pid), or in their sessions."""
    children: dict[int, list[int]] = {}
    for pid, p in procs.items():
        children.setdefault(p["ppid"], []).append(pid)
    found, stack = {}, [pid for pid in roots if pid in procs]
    stack += [pid for pid, p in procs.items() if p["session"] in roots]
    while stack:
        pid = stack.pop()
        if pid in found:
            continue
        found[pid] = procs[pid]
        stack.extend(children.get(pid, []))
    return found


class Sampler(threading.Thread):
    """Samples the SuperLink's tree, the ServerApp process and the SuperNodes' trees."""

    def __init__(self, superlink: int, nodes: list[int], interval: float = 1.0):
        super().__init__(daemon=True)
        self.superlink, self.nodes, self.interval = superlink, set(nodes), interval
        self.samples: list[dict] = []
        # last CPU seconds seen per pid (processes that exit keep their last value)
        self.cpu = {"superlink_tree": {}, "superlink": {}, "serverapp": {}, "supernodes": {}}
        self.stop_event = threading.Event()
        self.count = 0
        self.started = time.monotonic()

    def sample(self) -> dict:
        procs = processes()
        link = descendants(procs, {self.superlink})
        serverapp = {pid: p for pid, p in link.items() if "flwr-serverapp" in p["cmd"]}
        nodes = descendants(procs, self.nodes)
        parts = {"superlink_tree": link, "superlink": {pid: p for pid, p in link.items() if pid == self.superlink},
                 "serverapp": serverapp, "supernodes": nodes}
        row = {"t": round(time.monotonic() - self.started, 2), "load1": os.getloadavg()[0],
               "mem_available_mib": mem_available_mib()}
        self.count += 1
        for name, group in parts.items():
            # PSS: every sample for the SuperLink's few processes, every 5th for the nodes' many
            if name != "supernodes" or self.count % 5 == 1:
                row[f"{name}_pss"] = sum(pss(pid) for pid in group)
            for pid, p in group.items():
                self.cpu[name][pid] = p["cpu"]
            row[f"{name}_rss"] = sum(p["rss"] for p in group.values())
            row[f"{name}_cpu"] = round(sum(self.cpu[name].values()), 2)
            row[f"{name}_procs"] = len(group)
        return row

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.samples.append(self.sample())
            self.stop_event.wait(self.interval)

    def stop(self) -> list[dict]:
        self.stop_event.set()
        self.join(timeout=10)
        return self.samples


def stats(samples: list[dict], name: str, nodes: int, since: float = 0.0) -> dict:
    during = [s for s in samples if s["t"] >= since]
    rss = [s[f"{name}_rss"] for s in during if s[f"{name}_procs"]]
    pss_values = [s[f"{name}_pss"] for s in during if s[f"{name}_procs"] and f"{name}_pss" in s]
    cpu = during[-1][f"{name}_cpu"] - (during[0][f"{name}_cpu"] if since else 0.0)
    mib = 1 << 20
    out = {"peak_rss_mib": round(max(rss, default=0) / mib, 1),
           "mean_rss_mib": round(sum(rss) / len(rss) / mib, 1) if rss else 0.0,
           "peak_pss_mib": round(max(pss_values, default=0) / mib, 1),
           "mean_pss_mib": round(sum(pss_values) / len(pss_values) / mib, 1) if pss_values else 0.0,
           "cpu_seconds": round(cpu, 2)}
    out.update({f"{k}_per_node": round(v / nodes, 3) for k, v in out.items()})
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm", default="false", help="node config warm-worker: false, auto or true")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--timeout", type=float, default=600.0, help="run config timeout: seconds per phase")
    parser.add_argument("--min-free-mib", type=int, default=1500, help="abort the run below this MemAvailable")
    parser.add_argument("--max-seconds", type=float, default=0.0,
                        help="stop the run after this many seconds and report the rounds done (0: no limit)")
    parser.add_argument("--tmp", default=None, help="folder for Flower's state, logs, data (default: a new temp dir)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    n = args.nodes
    out_json = Path(args.out or ROOT / "benchmarks" / "results" / "deploy_scale" / f"n{n}.json")
    from clusterfed.cli import main as cli_main

    tmp = Path(args.tmp or tempfile.mkdtemp(prefix=f"clusterfed-bench-scale-{n}-"))
    tmp.mkdir(parents=True, exist_ok=True)
    parts, out = tmp / "parts", tmp / "out"
    data = {**setting("digits-pairs"), "num-clients": n}
    settings = sum((["--set", f"{k}={json.dumps(v) if isinstance(v, str) else v}"] for k, v in data.items()), [])
    assert cli_main(["partition", "--out", str(parts), *settings]) == 0
    manifest = json.loads((parts / "manifest.json").read_text())
    train = [c["train-samples"] for c in manifest["clients"]]
    config = {**data, "strategy": "fedclust", "fedclust.cluster-epochs": 2, "min-clients": n, "rounds": args.rounds,
              "timeout": args.timeout, "wait-timeout": 600.0, "batch-size": 32, "device": "cpu",
              "checkpoint": False, "out-dir": str(out)}
    result = {"nodes": n, "rounds": args.rounds, "warm_worker": args.warm, "run_config": config,
              "command": " ".join(sys.argv), "cpus": os.cpu_count(),
              "train_samples": {"min": min(train), "max": max(train), "total": sum(train)},
              "load_average_before": os.getloadavg(), "mem_available_mib_before": mem_available_mib()}
    print(f"tmp: {tmp}", flush=True)

    federation = Federation(tmp)
    sampler = None
    try:
        federation.start_superlink()
        superlink = federation.processes[0].pid
        started = time.monotonic()
        for i in range(n):
            federation.start_node(f"dev-{i}", parts / f"part-{i}.npz", f"warm-worker={json.dumps(args.warm)}")
        sampler = Sampler(superlink, [p.pid for p in federation.nodes.values()], args.interval)
        sampler.start()
        # let the nodes register: their start-up is not the run's cost
        wait_for(lambda: nodes_up(federation) >= n, 300, f"{n} SuperNodes registered", poll=2.0)
        result["nodes_registered_seconds"] = round(time.monotonic() - started, 1)
        time.sleep(3 * args.interval)
        idle = sampler.samples[-1]
        run_from = idle["t"]
        run_started = time.monotonic()
        run = federation.spawn([FLWR, "run", str(ROOT), "test", "--stream", "--run-config", overrides(config)],
                               "flwr-run")
        # a guard for a shared machine: give up (and say so) before memory runs out
        while run.poll() is None:
            if sampler.samples and sampler.samples[-1]["mem_available_mib"] < args.min_free_mib:
                result["aborted"] = f"MemAvailable below {args.min_free_mib} MiB"
                Federation.stop(run)
                break
            if args.max_seconds and time.monotonic() - run_started > args.max_seconds:
                result["aborted"] = f"run stopped after --max-seconds {args.max_seconds:g} (rounds done are reported)"
                Federation.stop(run)
                break
            time.sleep(1)
        result["flwr_run_wall_seconds"] = round(time.monotonic() - run_started, 1)
        result["flwr_run_rc"] = run.returncode
        time.sleep(2 * args.interval)
        samples = sampler.stop()
        result["alive_nodes_after"] = sum(p.poll() is None for p in federation.nodes.values())
    finally:
        if sampler is not None and sampler.is_alive():
            sampler.stop()
        federation.close()
        if sampler is not None:
            stop_orphaned_serverapps(sampler)

    records = rows(out)
    status_path = out / "status.json"
    result["status"] = json.loads(status_path.read_text()) if status_path.exists() else None
    result["rounds_done"] = len(records)
    result["per_round"] = [{k: r.get(k) for k in ("round", "round_seconds", "ari", "accuracy", "num_clusters",
                                                  "clients_known", "clients_absent", "failures", "bytes_down",
                                                  "bytes_up", "reply_lag_seconds")} for r in records]
    result["idle_before_run"] = {k: (round(v / (1 << 20), 1) if k.endswith(("_rss", "_pss")) else v)
                                 for k, v in idle.items()}
    result["during_run"] = {name: stats(samples, name, n, since=run_from)
                            for name in ("superlink_tree", "superlink", "serverapp", "supernodes")}
    result["whole_process_lifetime"] = {name: stats(samples, name, n)
                                        for name in ("superlink_tree", "superlink", "serverapp")}
    result["load_average_after"] = os.getloadavg()
    result["max_load1_during_run"] = max(s["load1"] for s in samples if s["t"] >= run_from)
    result["min_mem_available_mib_during_run"] = min(s["mem_available_mib"] for s in samples if s["t"] >= run_from)
    result["samples"] = samples
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=2))


def stop_orphaned_serverapps(sampler: Sampler) -> None:
    """A run stopped before its end leaves its ServerApp behind: Flower starts the SuperLink's
    SuperExec in a session of its own and stopping the SuperLink does not stop the
    ``flwr-serverapp`` process (seen when --max-seconds or the memory guard stops a run).
    Stop the ServerApp processes this run sampled, by their pids."""
    for pid in sampler.cpu["serverapp"]:
        try:
            if b"flwr-serverapp" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGTERM)
        except (OSError, ProcessLookupError):
            pass


def nodes_up(federation: Federation) -> int:
    listed = federation.flwr("supernode", "list", "test", "--format", "json")
    try:
        nodes = json.loads(listed.stdout).get("nodes", [])
    except (json.JSONDecodeError, AttributeError):
        return 0
    return sum(1 for node in nodes if str(node.get("status", "")).lower() == "online")


def mem_available_mib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 0


if __name__ == "__main__":
    main()
