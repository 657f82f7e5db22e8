#!/usr/bin/env bash
# The same `flwr run` simulation on Flower's default local Ray and on a two-node Ray cluster
# (both nodes on this machine, 127.0.0.1 only), then a comparison of the results.
#
#   VENV=/path/to/.venv benchmarks/ray_cluster.sh [RESULTS_DIR]
#
# Starts and stops its own two Ray nodes (head + worker, 1 CPU each, temp dirs under $WORK)
# and its own local SuperLinks (private FLWR_HOME and ports); never runs a bare `ray stop`,
# which would stop every Ray instance on the machine. Writes RESULTS_DIR/result.json and each
# run's rounds.jsonl, clusters.json, summary.json and log. docs/ray-cluster.md explains it.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-$REPO/.venv}
RESULTS=$(mkdir -p "${1:-$REPO/benchmarks/results/ray_cluster}" && cd "${1:-$REPO/benchmarks/results/ray_cluster}" && pwd)
WORK=${WORK:-/tmp/raytest}   # short: Ray's Unix socket paths under it must stay < 108 characters
export PATH="$VENV/bin:$PATH" PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
# Keep every Ray process on 127.0.0.1 (else Ray advertises the machine's routable IP).
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_DISABLE_USAGE_STATS=1

RUN_CONFIG='strategy="fedclust" rounds=3 num-clients=4 partitioner="label-groups" label-groups="0,1;2,3" fedclust.cluster-epochs=2 batch-size=32 device="cpu" checkpoint=false'
FED_CONFIG='num-supernodes=4 client-resources-num-cpus=1'

rm -rf "$WORK" && mkdir -p "$WORK"
free_port() { python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

pids_with() {  # pids of this user's processes whose command line contains $1 (a unique string)
  local p
  for p in /proc/[0-9]*; do
    # grep reads to the end (no -q): with pipefail, tr's SIGPIPE would fail a long command line
    { tr '\0' ' ' < "$p/cmdline"; } 2>/dev/null | grep -F -- "$1" > /dev/null && echo "${p#/proc/}"
  done || true
}

stop_ray() {  # stop_ray DIR...: the Ray processes started with these temp dirs, and their children
  local d p pids=() i
  for d in "$@"; do
    for p in $(pids_with "$d/"); do pids+=("$p" $(ps -o pid= --ppid "$p" || true)); done
  done
  [ ${#pids[@]} -gt 0 ] || return 0
  kill "${pids[@]}" 2>/dev/null || true
  for i in $(seq 20); do  # Ray's gcs_server and raylet take a few seconds over SIGTERM
    pids=($(for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && echo "$p"; done)) || true
    [ ${#pids[@]} -gt 0 ] || return 0
    sleep 0.5
  done
  kill -9 "${pids[@]}" 2>/dev/null || true
}

# run_flwr LABEL [VAR=value ...]: one `flwr run` on its own local SuperLink; wall time to $WORK/LABEL.wall
run_flwr() {
  local label=$1; shift
  local home cport t0 t1
  home=$(mktemp -d "$WORK/flwr-$label.XXXX"); cport=$(free_port)
  rm -rf "$WORK/out-$label"
  t0=$(date +%s.%N)
  env "$@" FLWR_HOME="$home" FLWR_LOCAL_CONTROL_API_PORT="$cport" FLWR_LOCAL_SUPERLINK_HTTP_API_PORT="$(free_port)" \
    flwr run "$REPO" --stream --run-config "$RUN_CONFIG out-dir=\"$WORK/out-$label\"" \
    --federation-config "$FED_CONFIG" > "$WORK/$label.log" 2>&1 || true
  t1=$(date +%s.%N)
  kill $(pids_with "--control-api-address 127.0.0.1:$cport") 2>/dev/null || true  # its SuperLink
  # `flwr run --stream` exits 0 even when the simulation crashed: a finished run has summary.json
  # A run in which Ray lost actors (e.g. its memory monitor killed workers on a machine near
  # 95% memory: ray.exceptions.OutOfMemoryError) has failed replies and other numbers: retried too.
  if [ ! -f "$WORK/out-$label/summary.json" ] || grep -q '"failures": [1-9]' "$WORK/out-$label/rounds.jsonl"; then
    echo "$label: failed"; grep -m3 -E "Exception|Error" "$WORK/$label.log" || tail -20 "$WORK/$label.log"
    cp "$WORK/$label.log" "$WORK/$label.failed.$(date +%s).log"; return 1
  fi
  python -c "print(round($t1 - $t0, 1))" > "$WORK/$label.wall"
  echo "$label: $(cat "$WORK/$label.wall") s"
}

# 1. Flower's default: the simulation starts its own local Ray (RAY_ADDRESS=local forces a new
#    instance even where `ray start` ran before). 2 CPUs here -> 2 ClientApp actors.
# A run whose Ray fails to start (on a loaded machine the raylet can time out waiting for its
# agents: "The current node timed out during startup"), or that lost replies, is tried once more
# (result.json's "attempts"; failed attempts' logs stay in $WORK).
attempt() { local label=$1; shift; : > "$WORK/$label.attempts"
  for _ in 1 2; do echo x >> "$WORK/$label.attempts"; run_flwr "$label" "$@" && return 0; stop_ray "$WORK/local"; done
  return 1; }
attempt local RAY_ADDRESS=local RAY_TMPDIR="$WORK/local"
stop_ray "$WORK/local"  # normally gone already: the simulation shuts its Ray down

# 2. A two-node Ray cluster on loopback: head and worker, 1 CPU each -> 1 actor per node.
PORT=$(free_port)
stop_cluster() { stop_ray "$WORK/head" "$WORK/worker"; }
trap stop_cluster EXIT
t0=$(date +%s.%N)
RAY_TMPDIR="$WORK/head" python "$REPO/benchmarks/ray_loopback_start.py" --head --node-ip-address=127.0.0.1 \
  --port="$PORT" --num-cpus=1 --include-dashboard=false --temp-dir="$WORK/head" > "$WORK/ray-head.log" 2>&1
RAY_TMPDIR="$WORK/worker" python "$REPO/benchmarks/ray_loopback_start.py" --address="127.0.0.1:$PORT" \
  --node-ip-address=127.0.0.1 --num-cpus=1 --temp-dir="$WORK/worker" > "$WORK/ray-worker.log" 2>&1
python -c "print(round($(date +%s.%N) - $t0, 1))" > "$WORK/ray-start.wall"  # both `ray start`s
attempt cluster RAY_ADDRESS="127.0.0.1:$PORT"
ray status --address="127.0.0.1:$PORT" > "$WORK/ray-status.txt" 2>&1 || true  # after: both nodes listed

# Where Ray put the ClientApp actors: each node's own session logs (its --temp-dir) hold one
# worker-<id>-<pid>.out per worker process; an actor's starts with ":actor_name:ClientAppActor".
python - "$WORK" "$PORT" "$RESULTS" "$RUN_CONFIG" "$FED_CONFIG" <<'PY'
import json, re, shutil, sys
from pathlib import Path
import ray

work, port, results = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
ray.init(address=f"127.0.0.1:{port}", logging_level="ERROR", log_to_driver=False)
nodes = {}
for n in ray.nodes():
    role = "head" if f"{work}/head/" in n["RayletSocketName"] else "worker"
    actors = sorted(
        int(re.search(r"-(\d+)\.out$", f.name).group(1))
        for f in (work / role / "session_latest" / "logs").glob("worker-*.out")
        if ":actor_name:ClientAppActor" in f.read_text(errors="replace")
    )
    nodes[role] = {"node_id": n["NodeID"], "address": n["NodeManagerAddress"],
                   "cpus": n["Resources"].get("CPU"), "client_app_actor_pids": actors}
ray.shutdown()

VOLATILE = re.compile(r"seconds$|^wall|_s$|^time")
def stable(x):  # a result without its timings
    if isinstance(x, dict):
        return {k: stable(v) for k, v in x.items() if not VOLATILE.search(k)}
    if isinstance(x, list):
        return [stable(v) for v in x]
    return x

runs = {}
for label in ("local", "cluster"):
    out = work / f"out-{label}"
    rounds = [json.loads(l) for l in (out / "rounds.jsonl").read_text().splitlines() if l.strip()]
    clusters = json.loads((out / "clusters.json").read_text())
    dest = results / label
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("rounds.jsonl", "clusters.json", "summary.json"):
        shutil.copy(out / name, dest / name)
    shutil.copy(work / f"{label}.log", dest / "flwr-run.log")
    runs[label] = {
        "wall_seconds": float((work / f"{label}.wall").read_text()),
        "attempts": len((work / f"{label}.attempts").read_text().split()),
        "accuracy": [r["accuracy"] for r in rounds],
        "client_accuracy": [r["client_accuracy"] for r in rounds],
        "cum_bytes_up": [r["cum_bytes_up"] for r in rounds],
        "cum_bytes_down": [r["cum_bytes_down"] for r in rounds],
        "assignment": clusters["assignment"],
        "_stable": (stable(rounds), stable(clusters)),
    }
a, b = runs["local"].pop("_stable"), runs["cluster"].pop("_stable")
result = {
    "run_config": sys.argv[4],
    "federation_config": sys.argv[5],
    "ray_address": f"127.0.0.1:{port}",
    "ray_start_seconds": float((work / "ray-start.wall").read_text()),  # not in the cluster run's wall time
    "runs": runs,
    "identical": {"rounds_jsonl_without_timings": a[0] == b[0], "clusters_json_without_timings": a[1] == b[1]},
    "ray_nodes": nodes,
    "actors_on_both_nodes": all(v["client_app_actor_pids"] for v in nodes.values()) and len(nodes) == 2,
}
(results / "result.json").write_text(json.dumps(result, indent=2) + "\n")
print(json.dumps({k: result[k] for k in ("identical", "actors_on_both_nodes")}, indent=None))
print({k: (v["wall_seconds"], v["accuracy"]) for k, v in runs.items()})
print({k: (v["node_id"][:8], v["client_app_actor_pids"]) for k, v in nodes.items()})
PY
cp "$WORK/ray-status.txt" "$RESULTS/ray-status.txt"
