"""Simulations of hundreds to thousands of small clients on one machine: speed and memory.

Run from the repository root with the repository on ``PYTHONPATH``:

    git worktree add --detach ../before <commit>     # the checkout to compare against
    PYTHONPATH=$PWD python benchmarks/bench_scale_speed.py compare --before ../before --clients 1000 --rounds 3 --repeats 2
    PYTHONPATH=$PWD python benchmarks/bench_scale_speed.py identical --before ../before --clients 20 --rounds 6 --strategies fedavg,cfl,hicfl
    PYTHONPATH=$PWD python benchmarks/bench_scale_speed.py overhead --clients 100,1000 --rounds 3
    PYTHONPATH=$PWD python benchmarks/bench_scale_speed.py profile --clients 1000 --rounds 2
    PYTHONPATH=$PWD python benchmarks/bench_scale_speed.py memory --clients 1000 --rounds 4 --before ../before
    PYTHONPATH=$PWD python benchmarks/bench_scale_speed.py memory --clients 10000 --rounds 3 --strategies fedavg,cfl
    PYTHONPATH=$PWD python benchmarks/bench_scale_speed.py ray --clients 1000 --rounds 2
    PYTHONPATH=$PWD python benchmarks/bench_scale_speed.py vmap --clients 100,1000
    PYTHONPATH=$PWD python benchmarks/bench_scale_speed.py overhead --setting synthetic-rotation-10000-frac0.1 --clients 10000 --rounds 3
    PYTHONPATH=$PWD python benchmarks/bench_scale_speed.py memory --setting synthetic-rotation-10000 --clients 10000 --rounds 3

The setting (every mode; ``vmap`` always): FedAvg on real MNIST (``--data-dir``, torchvision layout; 10,000
digits), ``rotation`` partitioner (0/90/180/270), so 1,000 clients hold ~10 images each (8
train, 2 test), 1 local epoch, batch 16, no checkpoints. ``--setting`` names another setting
of the registry for ``overhead``, ``profile``, ``ray`` and ``memory`` (``--clients`` still sets
the client count), e.g. the 10,000 clients of generated 8×8 digits, ``synthetic-rotation-10000``
(``-frac0.1``: 10 % of the clients train and are evaluated each round); ``memory`` takes only
the setting's model from it (its rows name the setting for that).

``overhead``: in-process engine; per round, round time / the clients' own compute
(``clusterfed.training.train`` + ``evaluate``, timed by wrapping them where the ClientApp
calls them), over the rounds after the first. Goal <= 1.15 at 1,000 clients.
``compare``: the same measurement for the checkout ``--before`` and this one, alternated in
subprocesses of one run (before, after, before, after, ...), so both see the same load.
``identical``: a short run of each checkout per strategy; every field of their ``rounds.jsonl``
but the timings must be equal bit for bit.
``profile``: cProfile of one in-process run, the top functions (``results/scale_speed/profile_N.txt``).
``memory``: what the server keeps per client beyond the cluster models, for FedAvg, CFL and
HiCFL, fed synthetic replies directly (no clients run): tracemalloc peak and retained bytes
per client over ``--rounds`` rounds, at each client count (goal <= 50 KB per client); with
``--before``, each also measured on that checkout (in a subprocess).
``ray``: Flower's simulation engine (Ray) at ``--clients`` virtual SuperNodes against the
in-process engine, same setting; wall and per-round time.
``vmap``: local training of many clients that share one cluster model, one client after
another vs batched with ``torch.func.functional_call`` + ``vmap``: clients per second and
the largest difference of the trained weights.

Every mode merges its entry into ``results/scale_speed/results.json`` (with the command,
the git commit and the machine's load average) and regenerates ``results/scale_speed/README.md``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "scale_speed"
DEFAULT_SETTING = "mnist-rotation"
SETTING = DEFAULT_SETTING  # --setting


def _git_commit(root: Path) -> str:
    state = git_state(root)
    return "unknown" if state["commit"] is None else state["commit"] + ("+dirty" if state["dirty"] else "")


from clusterfed.experiments.manifest import git_state  # noqa: E402
from clusterfed.experiments.settings import default_data_dir, setting, setting_name  # noqa: E402
from bench_engine_overhead import ClientClock, marking_rounds, overhead_record  # noqa: E402  (same folder: the script's own)


def _values(clients: int, rounds: int, out: str, data_dir: str, strategy: str = "fedavg", **extra) -> dict:
    return {**setting(SETTING), "strategy": strategy, "num-clients": clients, "rounds": rounds, "seed": 0,
            "data-dir": data_dir, "checkpoint": False, "out-dir": out, **extra}


def measure_overhead(clients: int, rounds: int, data_dir: str) -> dict:
    """Round time / client compute over the rounds after the first, in this process."""
    from clusterfed.config import parse_config
    from clusterfed.simulation import simulate

    with tempfile.TemporaryDirectory() as tmp, ClientClock() as clock, marking_rounds(clock) as marks:
        started = time.perf_counter()
        simulate(parse_config(_values(clients, rounds, tmp, data_dir)), engine="inprocess", stream=None)
        wall = time.perf_counter() - started
        rows = [json.loads(line) for line in (Path(tmp) / "rounds.jsonl").read_text().splitlines()]
    return {"setting": SETTING, **overhead_record(rows, marks, clients, rounds, wall, keys=("accuracy",))}


def _child(tree: Path, args: list[str]) -> dict:
    """Run this script's ``_child`` mode with ``tree`` first on PYTHONPATH; its JSON result."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    setting_args = ["--setting", SETTING] if SETTING != DEFAULT_SETTING else []
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "_child", *args, *setting_args], env=env,
                          capture_output=True, text=True, cwd=str(tree))
    if done.returncode:
        raise RuntimeError(f"child in {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(before: Path, after: Path, clients: list[int], rounds: int, repeats: int, data_dir: str) -> dict:
    runs = {"before": [], "after": []}
    for _ in range(repeats):
        for n in clients:
            for label, tree in (("before", before), ("after", after)):
                entry = _child(tree, ["overhead", str(n), str(rounds), data_dir])
                entry.pop("per_round", None)
                runs[label].append(entry)
                print(f"{label:>6} {n} clients: round {entry['round_seconds_mean']:.3f} s, client compute "
                      f"{entry['client_seconds_mean']:.3f} s, overhead {entry['overhead']:.3f}", flush=True)
    summary = {}
    for n in clients:
        row = {}
        for label in ("before", "after"):
            mine = [r for r in runs[label] if r["clients"] == n]
            row[label] = {"overhead": [r["overhead"] for r in mine],
                          "round_seconds_mean": [r["round_seconds_mean"] for r in mine],
                          "client_seconds_mean": [r["client_seconds_mean"] for r in mine]}
        b = sum(row["before"]["round_seconds_mean"]) / repeats
        a = sum(row["after"]["round_seconds_mean"]) / repeats
        row["round_time_after_over_before"] = round(a / b, 3)
        summary[str(n)] = row
    return {"before": str(before), "before_commit": _git_commit(before), "after": str(after),
            "after_commit": _git_commit(after), "rounds": rounds, "repeats": repeats, "clients": summary}


def identical(before: Path, after: Path, clients: int, rounds: int, data_dir: str, strategy: str = "fedavg") -> dict:
    rows = {label: _child(tree, ["rows", str(clients), str(rounds), data_dir, strategy])
            for label, tree in (("before", before), ("after", after))}
    def numbers(row):  # everything a round records except its timings
        return {k: v for k, v in row.items() if "second" not in k}

    same = all(numbers(a) == numbers(b) for a, b in zip(rows["before"]["rows"], rows["after"]["rows"]))
    return {"strategy": strategy, "clients": clients, "rounds": rounds,
            "identical": same and len(rows["before"]["rows"]) == rounds,
            "accuracy_before": [r.get("accuracy") for r in rows["before"]["rows"]],
            "accuracy_after": [r.get("accuracy") for r in rows["after"]["rows"]],
            "before_commit": _git_commit(before), "after_commit": _git_commit(after)}


def run_rows(clients: int, rounds: int, data_dir: str, engine: str = "inprocess", strategy: str = "fedavg",
             **extra) -> dict:
    from clusterfed.config import parse_config
    from clusterfed.simulation import simulate

    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        simulate(parse_config(_values(clients, rounds, tmp, data_dir, strategy, **extra)), engine=engine, stream=None)
        wall = time.perf_counter() - started
        rows = [json.loads(line) for line in (Path(tmp) / "rounds.jsonl").read_text().splitlines()]
    return {"wall_seconds": wall, "rows": rows}


def profile(clients: int, rounds: int, data_dir: str, top: int = 40) -> str:
    from clusterfed.config import parse_config
    from clusterfed.simulation import simulate

    with tempfile.TemporaryDirectory() as tmp:  # imports and caches first, outside the profile
        simulate(parse_config(_values(clients, 1, tmp, data_dir)), engine="inprocess", stream=None)
    with tempfile.TemporaryDirectory() as tmp:
        profiler = cProfile.Profile()
        profiler.enable()
        simulate(parse_config(_values(clients, rounds, tmp, data_dir)), engine="inprocess", stream=None)
        profiler.disable()
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats("clusterfed|flwr|pickle", top * 2)
    return stream.getvalue()


def ray_vs_inprocess(clients: int, rounds: int, data_dir: str) -> list[dict]:
    """The same short run on Flower's simulation engine (Ray) and in-process."""
    out = []
    for engine in ("flower", "inprocess"):
        started = time.perf_counter()
        try:
            run = run_rows(clients, rounds, data_dir, engine=engine)
        except Exception as error:  # noqa: BLE001 - a failed engine is a result too
            out.append({"setting": SETTING, "engine": engine, "clients": clients, "rounds": rounds,
                        "error": f"{type(error).__name__}: {error}",
                        "wall_seconds": round(time.perf_counter() - started, 1)})
            continue
        seconds = [r["round_seconds"] for r in run["rows"]]
        out.append({"setting": SETTING, "engine": engine, "clients": clients, "rounds": rounds,
                    "wall_seconds": round(run["wall_seconds"], 1),
                    "round_seconds": seconds, "round_seconds_mean": round(sum(seconds) / len(seconds), 2),
                    "accuracy": [r.get("accuracy") for r in run["rows"]]})
        print(out[-1], flush=True)
    return out


# --------------------------------------------------------------------------- memory
def model_shapes(setting_name: str) -> dict[str, tuple[int, ...]]:
    """The array shapes of the setting's model (``model = "auto"``): the MNIST CNN's 33,580
    numbers for MNIST, the digits CNN's for 8×8 images."""
    from clusterfed.datasets.shapes import DATASET_SHAPES
    from clusterfed.models import build_model

    dataset = setting(setting_name)["dataset"]
    shape, num_classes = DATASET_SHAPES[dataset]
    return {name: tuple(t.shape) for name, t in build_model("auto", dataset, shape, num_classes).state_dict().items()}


def _answer(steps, rng) -> int:
    """Run a strategy's exchange (a round, or the admission of clients) to its end, every ask
    answered with synthetic replies (float32, as clients send); returns the bytes of the
    replies of its largest batch (the uploads a server must hold)."""
    import numpy as np

    from clusterfed.strategies.base import steps as hook_steps
    from clusterfed.core.exchange import CHOICE, Replies, TrainReply

    largest = 0
    steps = iter(hook_steps(steps))
    try:
        asks = next(steps)
        while True:
            replies = Replies()
            for ask in asks:
                # a multi-model ask (IFCA) is answered with a drawn choice among its models
                metrics = {CHOICE: int(rng.integers(ask.choices))} if ask.choices else {}
                cluster, sent = ask.chosen(metrics)
                names = ask.upload or list(sent)
                update = ask.config.get("return") == "update"
                arrays = {n: (rng.standard_normal(sent[n].shape, dtype=np.float32) * np.float32(0.01)
                              + (0 if update else sent[n])).astype(np.float32) for n in names}
                replies.append(TrainReply(key=ask.key, cluster=cluster, arrays=arrays, sent={n: sent[n] for n in names},
                                          num_examples=10, train_loss=1.0, metrics=metrics, is_update=update))
            largest = max(largest, sum(a.nbytes for r in replies for a in r.arrays.values()))
            asks = steps.send(replies)
    except StopIteration:
        pass
    return largest


def measure_memory(strategy_name: str, clients: int, rounds: int, extra: dict | None = None) -> dict:
    """What ``strategy_name`` keeps per client beyond its cluster models, fed synthetic replies."""
    import gc
    import tracemalloc

    import numpy as np

    from types import MappingProxyType

    from clusterfed.config import parse_config
    from clusterfed.core.exchange import ClientInfo, Round

    values = {"strategy": strategy_name, "num-clients": clients, "out-dir": "/tmp/unused", **(extra or {})}
    strategy = parse_config(values).build_strategy()
    train_config = {"lr": 0.05, "local-epochs": 1}
    theta0 = {n: np.zeros(shape, np.float32) for n, shape in model_shapes(SETTING).items()}
    model_bytes = sum(a.nbytes for a in theta0.values())
    rng = np.random.default_rng(0)
    gc.collect()
    tracemalloc.start()
    strategy.init(theta0, train_config)
    keys = [str(i) for i in range(clients)]
    table = {key: ClientInfo(key, 10, i % 4 if (i := int(key)) >= 0 else 0) for key in keys}

    def round_of(server_round: int) -> Round:  # what a driver hands each round: every client active
        return Round(server_round, list(keys), dict(train_config), MappingProxyType(table))

    gc.collect()
    # from before the admission: what a one-shot strategy keeps from its clustering round counts
    base, _ = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    started = time.perf_counter()
    uploads = _answer(strategy.admit(round_of(1), keys), rng)
    for server_round in range(1, rounds + 1):
        uploads = max(uploads, _answer(strategy.round(round_of(server_round)), rng))
    gc.collect()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    cluster_bytes = len(strategy.models) * model_bytes
    kept = current - base - (cluster_bytes - model_bytes)  # beyond the cluster models (one existed at base)
    return {"setting": SETTING, "strategy": strategy_name, "clients": clients, "rounds": rounds,
            "clusters": len(strategy.models),
            "model_bytes": model_bytes, "seconds": round(time.perf_counter() - started, 1),
            "retained_kb_per_client": round(kept / clients / 1024, 2),
            "peak_kb_per_client": round((peak - base - (cluster_bytes - model_bytes)) / clients / 1024, 2),
            "peak_minus_uploads_kb_per_client": round((peak - base - uploads - (cluster_bytes - model_bytes))
                                                      / clients / 1024, 2),
            "uploads_kb_per_client": round(uploads / clients / 1024, 2), "extra": extra or {}}


# --------------------------------------------------------------------------- vmap
def vmap_prototype(clients: int, data_dir: str, per_client: int = 8, batch_size: int = 16, lr: float = 0.05,
                   momentum: float = 0.5, repeats: int = 2) -> dict:
    """One local epoch of ``clients`` clients sharing one cluster model (MNIST CNN, ``per_client``
    images each, fewer than a batch: one SGD step): ``clusterfed.training.train`` client after
    client, against one ``torch.func.vmap`` over the clients of ``functional_call`` + ``grad``
    (the first step of SGD with momentum is ``w - lr * g``). Same data order (each client's seeded
    permutation), same start. Returns clients per second both ways and the largest weight gap."""
    import numpy as np
    import torch
    from torch.func import functional_call, grad, vmap

    from clusterfed.datasets import load_source
    from clusterfed.models import build_model
    from clusterfed.training import cap_threads, load_numpy_state, state_to_numpy, train

    if per_client > batch_size:
        raise ValueError("the prototype covers one step per epoch (per_client <= batch_size)")
    cap_threads()
    source = load_source("mnist", data_dir)
    x = source.x[: clients * per_client].reshape(clients, per_client, *source.x.shape[1:]).copy()
    y = source.y[: clients * per_client].reshape(clients, per_client).copy()
    model = build_model("auto", "mnist", source.input_shape, source.num_classes, 0)
    theta = state_to_numpy(model)
    seeds = list(range(clients))

    def sequential():
        out = []
        for c in range(clients):
            load_numpy_state(model, theta)
            train(model, x[c], y[c], epochs=1, batch_size=batch_size, lr=lr, momentum=momentum, seed=seeds[c])
            out.append(state_to_numpy(model))
        return out

    names = [n for n, _ in model.named_parameters()]
    loss_fn = torch.nn.CrossEntropyLoss()

    def loss_of(params, xb, yb):
        return loss_fn(functional_call(model, params, (xb,)), yb)

    per_client_grad = vmap(grad(loss_of), in_dims=(None, 0, 0))

    def batched():
        load_numpy_state(model, theta)
        model.train()
        params = {n: p.detach() for n, p in model.named_parameters()}
        orders = torch.stack([torch.randperm(per_client, generator=torch.Generator().manual_seed(s)) for s in seeds])
        xt, yt = torch.from_numpy(x), torch.from_numpy(y)
        index = orders[:, :, None, None, None].expand(-1, -1, *xt.shape[2:])
        xb, yb = torch.gather(xt, 1, index), torch.gather(yt, 1, orders)
        grads = per_client_grad(params, xb, yb)
        # SGD with momentum, first step: buffer = g, w <- w - lr * g
        return {n: (params[n][None] - lr * grads[n]).numpy() for n in names}

    timings = {"sequential": [], "vmap": []}
    results = {}
    for _ in range(repeats):  # alternated, so both see the same load
        for label, fn in (("sequential", sequential), ("vmap", batched)):
            started = time.perf_counter()
            results[label] = fn()
            timings[label].append(time.perf_counter() - started)
    gap = max(float(np.max(np.abs(results["vmap"][n][c] - results["sequential"][c][n])))
              for c in range(clients) for n in names)
    seq, vec = min(timings["sequential"]), min(timings["vmap"])
    return {"clients": clients, "per_client": per_client, "sequential_seconds": round(seq, 3),
            "vmap_seconds": round(vec, 3), "sequential_clients_per_second": round(clients / seq, 1),
            "vmap_clients_per_second": round(clients / vec, 1), "speedup": round(seq / vec, 2), "max_abs_diff": gap,
            "torch_threads": torch.get_num_threads()}


# --------------------------------------------------------------------------- results
def save(mode: str, entry: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "results.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    command = "PYTHONPATH=$PWD python " + " ".join(["benchmarks/bench_scale_speed.py", *sys.argv[1:]])
    if "results" in entry:  # every row names the command that measured it
        entry = {**entry, "results": [{**r, "command": r.get("command", command)} for r in entry["results"]]}
    if "results" in entry and "results" in data.get(mode, {}):  # keep earlier rows of other settings
        def ident(row):
            return (row.get("strategy"), row.get("engine"), row["clients"], row.get("setting", DEFAULT_SETTING))

        mine = {ident(r) for r in entry["results"]}
        kept = [{**r, "command": r.get("command", data[mode]["command"])} for r in data[mode]["results"]
                if ident(r) not in mine]
        entry = {**entry, "results": sorted(kept + entry["results"],
                                            key=lambda r: (ident(r)[3] != DEFAULT_SETTING, r["clients"], str(ident(r)[:2])))}
    data[mode] = {"command": command,
                  "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": _git_commit(HERE.parent),
                  "cpus": os.cpu_count(), "load_average_at_end": [round(x, 2) for x in os.getloadavg()], **entry}
    path.write_text(json.dumps(data, indent=1) + "\n")
    write_readme(data)


NOTES = {
    "compare": "Non-client time removed, numbers unchanged (golden tests and `identical` check it): the in-process "
               "grid copies a message by cloning Flower's record objects and sharing the immutable Array bytes instead "
               "of a pickle round trip; arrays are encoded/decoded with their dtype name, shape and .npy header cached "
               "per (dtype, shape) and one copy (the client loads the model from read-only views of the message "
               "bytes); an ArrayRecord is filled item by item (its dict constructor built every Array twice); every "
               "client's data stays cached (the cache held 256 clients, so at 1,000 every message rebuilt its "
               "client's arrays); one state_dict per model load; byte counting without Flower's per-access record "
               "view; FedAvg sums in place. What is left per client and round is Flower's own message machinery "
               "(Message, RecordDict, ConfigRecord and MetricRecord constructors validate every value), the "
               "server's reply validation and decode, and the sample-weighted sum: about a tenth of a millisecond "
               "each, against about 5 ms of compute for 8 training images. The last column compares runs minutes apart "
               "while other jobs' load on the two cores changed several-fold; the overhead ratio, taken within each "
               "run, is the measure.",
    "memory": "Retained = what the strategy keeps between rounds beyond its cluster models; peak includes the round's "
              "uploads, which any Flower server holds while it aggregates. FedAvg, the oracle and IFCA keep nothing "
              "per client (AdaCFL under 1 KB: its assignments and newcomer records). FedClust, whose clustering "
              "round on these random replies finds no groups, keeps every client's final-layer change as sent "
              "(float32) for a later cut until a cut finds groups or has seen every known client; its peak is "
              "its clustering round's float64 rows and distances. CFL keeps per client "
              "what its similarity compares (an absent member of a splitting cluster is placed by it): the latest "
              "update as sent (float32), or for clients of fewer than 50 examples, as here (similarity-decay auto), "
              "the updates summed with decay 0.8 in float64, twice the bytes of one update: 262 KB for the MNIST "
              "CNN, 107 KB for the digits CNN. LayerCFL keeps the same for its decision layers only. HiCFL keeps per "
              "layer the latest full update (the weight selection and the reference split read it), up to three "
              "selected updates (the three-update stability score) and the selection. (The float32 copies and int32 "
              "selections that halved CFL's and HiCFL's retained bytes were measured before/after in commit "
              "ed1725af58's version of this file; CFL's summed updates came later.) These rows are the papers' exact "
              "storage; the CFL family's compact storage above 1,000 clients (update-storage, count sketches and "
              "weight samples) and a table of every strategy at up to 10,000 clients are in "
              "benchmarks/results/memory/. CFL's peak is its split criteria's "
              "matrix (one float64 row per replying client, from which its norms are computed; computing them "
              "streaming would sum in another order).",
    "overhead": "Client compute = the ClientApp's training and evaluation calls, timed where it makes them; the rest "
                "of a round is Flower's message machinery, the server's reply validation and decoding, and the "
                "aggregation, about the same per message at both scales (round s − client compute s over the "
                "round's training plus evaluation messages). Each client's compute is smaller at 10,000 generated "
                "8×8 clients (the digits CNN) than at 1,000 MNIST clients, so the same per-message cost is a larger "
                "share there. Both rows ran while two experiment workers used the two cores.",
    "ray": "Flower's simulation engine with `client_resources = {num_cpus: 1}` (clusterfed/simulation.py): two "
           "actors on two cores, 1,000 virtual SuperNodes; the same accuracies as in-process. Round 1 includes the "
           "actors' start, their data loading and the 1,000 profile queries; compare round 2 (`round_seconds` in "
           "results.json) for the engines' steady state.",
    "vmap": "One SGD step per client (8 images < batch 16), all clients from the same cluster model: the per-client "
            "gradients of a vmap over functional_call agree with sequential training to float tolerance, not bit for "
            "bit (batched convolutions sum in another order), and on this 2-core CPU the batched step is no clear win "
            "over the clients one after another (the table: from slower to a little faster, run to run, under the "
            "load of other jobs): conv2d already fills the core for a batch of 8, so batching the clients saves only "
            "the per-call overhead. Not adopted: it would change every golden number for no dependable gain here, "
            "and it needs equal-sized (padded) client batches, per-client optimizer state for more than one step, "
            "and a training loop the built-in task does not control for a user's own ClientTask.",
}


def write_readme(data: dict) -> None:
    lines = ["# Scale and speed of simulations with many small clients", "",
             "Generated by `benchmarks/bench_scale_speed.py` from `results.json` (commands, commits, load "
             "averages there). Setting: FedAvg, MNIST rotation (0/90/180/270), ~10 images per client at "
             "1,000 clients, 1 local epoch, batch 16, unless a row names another setting of the registry: "
             "`synthetic-rotation-10000` is 10,000 clients of 12 generated 8×8 digits (the digits CNN, 13,706 "
             "numbers), `-frac0.1` with 10 % of them training and evaluated each round. In the memory table "
             "the setting gives only the model; the client count is the row's. Retained bytes slightly below "
             "zero are the measurement's noise (allocator and garbage collection), i.e. nothing kept.", ""]
    if "compare" in data:
        entry = data["compare"]
        lines += ["## In-process engine: round time / the clients' own compute", "",
                  f"`{entry['command']}` (before `{entry['before_commit'][:10]}`, after `{entry['after_commit'][:10]}`, "
                  f"alternated in one run; load average at end {entry['load_average_at_end']})", "",
                  "| clients | overhead before | overhead after | round time after / before |", "|---|---|---|---|"]
        for n, row in entry["clients"].items():
            lines.append(f"| {n} | {', '.join(map(str, row['before']['overhead']))} | "
                         f"{', '.join(map(str, row['after']['overhead']))} | {row['round_time_after_over_before']} |")
        lines.append("")
    if "overhead" in data:
        entry = data["overhead"]
        commands = dict.fromkeys(r.get("command", entry["command"]) for r in entry["results"])
        lines += ["## In-process engine overhead (this commit)", "", *[x for c in commands for x in (f"`{c}`", "")],
                  "| setting | clients | round s | client compute s | overhead |", "|---|---|---|---|---|"]
        for r in entry["results"]:
            lines.append(f"| {r.get('setting', DEFAULT_SETTING)} | {r['clients']} | {r['round_seconds_mean']} | "
                         f"{r['client_seconds_mean']} | {r['overhead']} |")
        lines.append("")
    if "identical" in data:
        entry = data["identical"]
        lines += ["## Bit-identical runs (before / after)", "", f"`{entry['command']}`", "",
                  "| strategy | clients | rounds | every rounds.jsonl field but timings identical |",
                  "|---|---|---|---|"]
        for r in entry["results"]:
            lines.append(f"| {r['strategy']} | {r['clients']} | {r['rounds']} | {r['identical']} |")
        lines.append("")
    if "memory" in data:
        entry = data["memory"]
        commands = dict.fromkeys(r.get("command", entry["command"]) for r in entry["results"])
        lines += ["## Server memory per client (beyond the cluster models)", "",
                  *[x for c in commands for x in (f"`{c}`", "")],
                  "| setting | strategy | clients | peak KB / client | peak beyond the uploads | retained KB / client |",
                  "|---|---|---|---|---|---|"]
        for r in entry["results"]:
            lines.append(f"| {r.get('setting', DEFAULT_SETTING)} | {r['strategy']} | {r['clients']} | {r['peak_kb_per_client']} "
                         f"(uploads {r['uploads_kb_per_client']}) | {r['peak_minus_uploads_kb_per_client']} | "
                         f"{r['retained_kb_per_client']} |")
        lines.append("")
    if "ray" in data:
        entry = data["ray"]
        lines += ["## Flower's simulation engine (Ray) vs in-process", "", f"`{entry['command']}`", "",
                  "| setting | engine | clients | rounds | wall s | mean round s |", "|---|---|---|---|---|---|"]
        for r in entry["results"]:
            lines.append(f"| {r.get('setting', DEFAULT_SETTING)} | {r['engine']} | {r['clients']} | {r['rounds']} | "
                         f"{r.get('wall_seconds')} | "
                         f"{r.get('round_seconds_mean')} |")
        lines.append("")
    if "vmap" in data:
        entry = data["vmap"]
        lines += ["## Batched local training (torch.func vmap) prototype", "", f"`{entry['command']}`", "",
                  "| clients | sequential clients/s | vmap clients/s | speed-up | max abs weight diff |",
                  "|---|---|---|---|---|"]
        for r in entry["results"]:
            lines.append(f"| {r['clients']} | {r['sequential_clients_per_second']} | {r['vmap_clients_per_second']} | "
                         f"{r['speedup']} | {r['max_abs_diff']:.2e} |")
        lines.append("")
    lines += ["## Notes", ""] + [f"- **{mode}**: {text}" for mode, text in NOTES.items() if mode in data] + [""]
    (OUT / "README.md").write_text("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("overhead", "compare", "identical", "profile", "memory", "ray", "vmap", "_child"))
    parser.add_argument("rest", nargs="*")
    parser.add_argument("--clients", default="100,1000")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--before", default="")
    parser.add_argument("--data-dir", default=str(default_data_dir()))
    parser.add_argument("--strategies", default="fedavg,cfl,hicfl")
    parser.add_argument("--setting", default=DEFAULT_SETTING, help="a setting of the registry (default mnist-rotation)")
    args = parser.parse_args()
    global SETTING
    SETTING = setting_name(args.setting)
    import logging

    logging.getLogger("flwr").setLevel(logging.WARNING)
    clients = [int(c) for c in args.clients.split(",")]
    if args.mode == "_child":
        kind, n, rounds, data_dir = args.rest[0], int(args.rest[1]), int(args.rest[2]), args.rest[3]
        if kind == "overhead":
            print(json.dumps(measure_overhead(n, rounds, data_dir)))
        elif kind == "memory":
            name = args.rest[4]
            extra = {f"{name}.min-split-round": 10_000} if name in ("cfl", "hicfl") else {}
            print(json.dumps(measure_memory(name, n, rounds, extra)))
        else:
            strategy = args.rest[4] if len(args.rest) > 4 else "fedavg"
            print(json.dumps(run_rows(n, rounds, data_dir, strategy=strategy)))
        return 0
    if args.mode == "overhead":
        results = [measure_overhead(n, args.rounds, args.data_dir) for n in clients]
        for r in results:
            print(f"{r['clients']} clients: round {r['round_seconds_mean']:.3f} s, client compute "
                  f"{r['client_seconds_mean']:.3f} s, overhead {r['overhead']:.3f}")
        save("overhead", {"results": results})
    elif args.mode == "compare":
        save("compare", compare(Path(args.before).resolve(), HERE.parent, clients, args.rounds, args.repeats,
                                args.data_dir))
    elif args.mode == "identical":
        results = []
        for name in args.strategies.split(","):
            results.append(identical(Path(args.before).resolve(), HERE.parent, clients[0], args.rounds, args.data_dir,
                                     name))
            print(json.dumps(results[-1]), flush=True)
        save("identical", {"results": results})
    elif args.mode == "profile":
        text = profile(clients[0], args.rounds, args.data_dir)
        print(text[:6000])
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / f"profile_{clients[0]}.txt").write_text(text)
    elif args.mode == "ray":
        results = [r for n in clients for r in ray_vs_inprocess(n, args.rounds, args.data_dir)]
        ok = {r["engine"]: r for r in results if "error" not in r}
        entry = {"results": results}
        if len(ok) == 2:
            entry["ray_over_inprocess_round_time"] = round(ok["flower"]["round_seconds_mean"]
                                                           / ok["inprocess"]["round_seconds_mean"], 2)
            entry["ray_over_inprocess_wall"] = round(ok["flower"]["wall_seconds"] / ok["inprocess"]["wall_seconds"], 2)
        save("ray", entry)
    elif args.mode == "memory":
        results = []
        for n in clients:
            for name in args.strategies.split(","):
                # no split or merge during the measurement: what is kept per client between rounds
                extra = {f"{name}.min-split-round": 10_000} if name in ("cfl", "hicfl") else {}
                if args.before:  # the same measurement on the checkout --before, in a subprocess
                    row = _child(Path(args.before).resolve(), ["memory", str(n), str(args.rounds), "-", name])
                    results.append({**row, "strategy": f"{name} (before)"})
                results.append(measure_memory(name, n, args.rounds, extra))
                r = results[-1]
                print(f"{name:>7} {n:>6} clients: retained {r['retained_kb_per_client']:.1f} KB/client, peak "
                      f"{r['peak_kb_per_client']:.1f} KB/client (of which uploads {r['uploads_kb_per_client']:.1f}), "
                      f"{r['seconds']} s", flush=True)
        save("memory", {"results": results})

    elif args.mode == "vmap":
        results = []
        for n in clients:
            results.append(vmap_prototype(n, args.data_dir))
            print(results[-1], flush=True)
        save("vmap", {"results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
