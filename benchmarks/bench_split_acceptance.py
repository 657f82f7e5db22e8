"""Measure the split-acceptance statistic of CFL (silhouette of the proposed bi-partition).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_split_acceptance.py --seeds 0,1 --rounds 50 \
        --settings iid,rotation,label-swap,label-groups,shards --workers 2
    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_split_acceptance.py --no-split --seeds 0 --rounds 50 \
        --settings rotation,label-swap,shards,label-groups --workers 2 --out /tmp/nosplit.json

(The committed JSON merges three such runs; its ``commands`` and ``note`` say which.)

Digits, 20 clients, defaults otherwise. Every round ≥ ``min-split-round`` and for every
leaf cluster with ≥ ``min-split-size`` replies, the cluster's updates are bi-partitioned
exactly as CFL does (cosine similarity, complete linkage) — whether or not the split
criteria fire — and the split's silhouette on ``1 − S`` and side-based Gap are recorded
with the cluster's true groups:

- ``noise``: the cluster holds one true group (iid clients; a pure cluster) — a split here
  is a bi-partition of noise and must be refused;
- ``correct``: the cluster holds ≥ 2 groups and the proposed sides share no group (level =
  depth of the split: 1 first level, 2 second level, …) — must be accepted;
- ``impure``: ≥ 2 groups but a group on both sides (a wrong proposal; for the record).

``iid`` runs never split (``min-split-round`` beyond the run: FedAvg dynamics, rounds
5…R of one 20-client cluster). Structured runs are ``cfl`` with the silhouette test off
(``split-min-silhouette = -1``, the old behaviour), so their trees form and over-split,
which yields both correct splits and pure clusters late in training. Writes
``benchmarks/results/split_acceptance.json``: every record and, per category (all
rounds / rounds where the relative criteria fired), min, percentiles and max.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from multiprocessing import get_context
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent

from clusterfed.experiments import settings as registry  # noqa: E402
from clusterfed.clustering.bipartition import bipartition  # noqa: E402
from clusterfed.clustering.split_scores import (  # noqa: E402
    best_cut_silhouette,
    cosine_similarity_matrix,
    separation_gap,
    split_silhouette,
)
from clusterfed.config import parse_config  # noqa: E402
from clusterfed.simulation import simulate  # noqa: E402
from clusterfed.clustering.vectors import flatten  # noqa: E402
from clusterfed.strategies import cfl  # noqa: E402

RECORDS: list[dict] = []
NO_SPLIT = False  # --no-split: every setting under FedAvg dynamics (the root is proposed for a split every round)


def instrumented(original):
    """CFL's split decision (``cfl.decide``, what the tree calls for every leaf that replied),
    recording the bi-partition CFL proposes for the cluster before deciding as CFL does."""
    def decide(tree, state, server_round, cluster, replies, decision, clients, reports, **kwargs):
        params = kwargs["params"]
        if server_round >= min(params.min_split_round, 5) and len(replies) >= params.min_split_size:
            keys = [r.key for r in replies]
            names = kwargs["names"](state)
            U = np.stack([flatten(r.update, names) for r in replies]).astype(np.float64)
            S = cosine_similarity_matrix(U)
            a, b = bipartition(S)
            best_k = best_cut_silhouette(S, 6)
            groups = [clients[k].true_group for k in keys]
            ga, gb = {groups[i] for i in a}, {groups[i] for i in b}
            if len(ga | gb) == 1:
                kind = "noise"
            elif ga & gb:
                kind = "impure"
            else:
                kind = "correct"
            RECORDS.append({"round": server_round, "cluster": cluster, "members": len(keys),
                            "depth": state.tree.node(cluster).depth, "groups": len(ga | gb), "kind": kind,
                            "criteria_fired": bool(decision.split), "silhouette": split_silhouette(S, a, b),
                            "best_cut_silhouette": best_k[0], "best_cut_k": best_k[1],
                            "gap": separation_gap(S, a, b), "cross_max": float(S[np.ix_(a, b)].max()),
                            "cross_mean": float(S[np.ix_(a, b)].mean()),
                            "intra_mean": float(np.mean([S[np.ix_(s, s)][~np.eye(s.size, dtype=bool)].mean()
                                                         for s in (a, b) if s.size > 1]))})
        return original(tree, state, server_round, cluster, replies, decision, clients, reports, **kwargs)

    decide.instrumented = True
    return decide


def one_run(job: tuple[str, int, int, bool]) -> list[dict]:
    setting, seed, rounds, no_split = job
    if not getattr(cfl.decide, "instrumented", False):  # once per worker process, before CFL builds its tree
        cfl.decide = instrumented(cfl.decide)
    RECORDS.clear()
    # Sattler's timing (the paper's): what this benchmark measured, the criteria firing or not
    values = {"strategy": "cfl", "num-clients": 20, "rounds": rounds, "seed": seed,
              "out-dir": tempfile.mkdtemp(prefix="split-acceptance-"), "split-min-silhouette": -1.0,
              "split-timing": "criteria", **registry.setting(setting)}
    if registry.setting_name(setting) == "digits-iid" or no_split:
        values["min-split-round"] = rounds + 1
    simulate(parse_config(values), engine="inprocess", stream=None)
    print(f"done {setting} seed {seed}: {len(RECORDS)} records", flush=True)
    return [{"setting": setting, "seed": seed, **r} for r in RECORDS]


def summary(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    v = np.array(values)
    return {"n": int(v.size), "min": float(v.min()), "p5": float(np.percentile(v, 5)),
            "median": float(np.median(v)), "p95": float(np.percentile(v, 95)), "max": float(v.max())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", default="iid,rotation,label-swap,label-groups,shards")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-split", action="store_true",
                        help="FedAvg dynamics for every setting: the root's proposal every round")
    parser.add_argument("--out", default=str(ROOT / "results" / "split_acceptance.json"))
    args = parser.parse_args(argv)
    jobs = [(s, int(seed), args.rounds, args.no_split) for s in args.settings.split(",") for seed in args.seeds.split(",")]
    with get_context("fork").Pool(args.workers) as pool:
        records = [r for rows in pool.map(one_run, jobs, chunksize=1) for r in rows]
    groups: dict[str, dict] = {}
    for r in records:
        name = r["kind"] if r["kind"] != "correct" else f"correct-level{r['depth'] + 1}"
        for label in (f"{name}/all", f"{name}/{r['setting']}"):
            g = groups.setdefault(label, {"all": [], "fired": []})
            g["all"].append(r["silhouette"])
            if r["criteria_fired"]:
                g["fired"].append(r["silhouette"])
    out = {
        "command": "python benchmarks/bench_split_acceptance.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "statistic": "silhouette of the proposed 2-way split on 1 - cosine similarity of the members' full updates",
        "summary": {k: {"all_rounds": summary(v["all"]), "criteria_fired": summary(v["fired"])}
                    for k, v in sorted(groups.items())},
        "records": records,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    for k, v in sorted(groups.items()):
        s, f = summary(v["all"]), summary(v["fired"])
        line = f"{k:32s} all n={s['n']:4d}"
        if s["n"]:
            line += f" min {s['min']:.3f} p5 {s['p5']:.3f} med {s['median']:.3f} p95 {s['p95']:.3f} max {s['max']:.3f}"
        if f["n"]:
            line += f" | fired n={f['n']} min {f['min']:.3f} max {f['max']:.3f}"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
