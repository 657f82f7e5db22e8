"""Write benchmarks/results/containers/{result.json,README.md} from what scripts/test-containers.sh left.

    python scripts/containers/report.py CACHE_DIR RESULTS_DIR
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

cache, results = Path(sys.argv[1]), Path(sys.argv[2])


def _text(path: Path) -> str:
    return path.read_text().strip() if path.exists() else ""


def _version(*command: str) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=30).stdout.strip().split("\n")[0]
    except OSError:
        return ""


timings = {}
for line in _text(cache / "timings.txt").split("\n"):
    if line.strip():
        name, seconds = line.split()
        timings[name] = round(float(seconds), 1)
# podman prints sizes like "5.87 GB"
images = {}
for line in _text(cache / "images.txt").split("\n"):
    if line:
        name, size = line.split(" ", 1)
        images[name] = size
runs = {}
for mode in ("plain", "tls"):
    status = results / f"status-{mode}.json"
    if status.exists():
        runs[mode] = {"status_json": f"status-{mode}.json", "status": json.loads(status.read_text()).get("status"),
                      "containers": _text(cache / f"ps_{mode}.txt").split("\n")}
        summary = results / f"summary-{mode}.json"
        if summary.exists():
            data = json.loads(summary.read_text())
            runs[mode]["summary"] = {k: data[k] for k in ("rounds", "final_accuracy", "wall_seconds") if k in data}
root = Path(__file__).resolve().parents[2]
result = {
    "what": "docker/Dockerfile's images built with podman and the compose federation (docker/compose.yml, then "
            "with compose.tls.yml) run for real: `flwr run` FedAvg, 2 rounds, 2 SuperNodes, digits",
    "date": datetime.date.today().isoformat(),
    "commit_at_measurement": subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                                            capture_output=True, text=True).stdout.strip(),
    "host": "x86_64, 2 shared cores, Debian 12, rootful podman (runc, cgroups v1, netavark)",
    "versions": {"podman": _version("podman", "--version"), "buildah": _version("buildah", "--version"),
                 "podman-compose": _version(str(cache / "tools/bin/podman-compose"), "--version")},
    "torch_index": _text(cache / "torch_index.txt"),
    "commands": [
        "make test-containers   (= scripts/test-containers.sh: setup base images plain tls)",
        "podman build -f docker/Dockerfile --build-arg TORCH_INDEX=<index> -t clusterfed-client:0.1.0 .",
        "podman build -f docker/Dockerfile --build-arg TORCH_INDEX=<index> --build-arg EXTRAS=[server] "
        "-t clusterfed-server:0.1.0 .",
        "podman-compose -p clusterfed -f docker/compose.yml up -d",
        "podman healthcheck run clusterfed_superlink_1 (and each supernode) until it passes",
        "flwr run . containers --stream --run-config 'strategy=\"fedavg\" num-clients=2 min-clients=2 rounds=2 "
        "out-dir=\"results/containers-<mode>\"'",
        "podman-compose -p clusterfed -f docker/compose.yml -f docker/compose.tls.yml up -d   (then the same)",
    ],
    "timings_seconds": timings,
    # the first run on this machine, by steps, before anything was cached (base, stand-ins)
    "timings_first_run_seconds": {line.split()[0]: float(line.split()[1])
                                  for line in _text(cache / "timings-first-run.txt").split("\n") if line.strip()},
    "image_sizes": images,
    "runs": runs,
}
results.mkdir(parents=True, exist_ok=True)
(results / "result.json").write_text(json.dumps(result, indent=1) + "\n")

t = timings
lines = [
    "# Container check (`make test-containers`)",
    "",
    f"Measured {result['date']} on {result['host']} (commit {result['commit_at_measurement']} + the working "
    f"tree of that run), {result['versions']['podman']}, {result['versions']['podman-compose']}. "
    "Every number is in `result.json`; each run's `status.json` is beside it.",
    "",
    "No container registry is reachable here, so the script builds local bases: Debian 12 minbase + "
    "python3 (debootstrap, `podman import`) and stand-ins tagged `docker.io/flwr/{superlink,supernode,"
    "superexec}:1.41.0` (`scripts/containers/flwr-standin.Containerfile`: a venv with flwr 1.41.0, user "
    "49999, the `flower-*` entrypoint). docker/Dockerfile and the compose files are used unchanged on top.",
    f"torch came from `{result['torch_index']}`"
    + (" (PyTorch's CPU index is not reachable here, so the images carry the x86_64 CUDA build of torch "
       "2.14.1; with `--build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu`, the default, they "
       "carry the CPU build)." if "pypi.org" in result["torch_index"] else "."),
    "",
    "| step | seconds |",
    "| --- | --- |",
]
for name, seconds in t.items():
    lines.append(f"| {name} | {seconds} |")
if result["timings_first_run_seconds"]:
    lines += ["", "The first run on this machine (nothing cached; steps run one by one): "
              + ", ".join(f"{k} {v}" for k, v in result["timings_first_run_seconds"].items()) + " s."]
lines += ["", "| image | size |", "| --- | --- |"]
for name, size in images.items():
    lines.append(f"| {name} | {size} |")
lines += ["", "| federation | status.json | containers |", "| --- | --- | --- |"]
for mode, data in runs.items():
    lines.append(f"| {mode} | `{data['status']}` ({data['status_json']}) | {len(data['containers'])} |")
lines += [
    "",
    "`up_*`: `podman-compose up -d` returning; `healthy_*`: from then until `podman healthcheck run` passed "
    "for the SuperLink and both SuperNodes; `flwr_run_*`: the whole `flwr run --stream` (2 rounds).",
    "",
]
(results / "README.md").write_text("\n".join(lines))
print(json.dumps(runs, indent=1))
