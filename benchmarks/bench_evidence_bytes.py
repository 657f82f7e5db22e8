"""Evidence without the bytes: FedClust's (and AdaCFL's) clustering upload before and after the
projection of each candidate layer's update (``clusterfed/clustering/evidence_sketch.py``).

    PYTHONPATH=$PWD:$PWD/tests:$PWD/benchmarks python benchmarks/bench_evidence_bytes.py \
        --out benchmarks/results/evidence-bytes [--draws 0-199] [--runs 0-3] [--skip-digits]

Three parts, each in bytes per client:

- ``digits``: the built-in digits CNN, 12 clients in 4 label-pair groups (clusterfed's own client):
  FedClust's clustering round with ``evidence-sketch`` off (before: every candidate layer whole)
  and on (after), one round each; the clustering upload, a training round's upload, the ARI.
- ``draws``: the random-model harness's cells (``benchmarks/fuzz/cell.py``, development seeds
  only), models only (nothing trained): FedClust's and AdaCFL's clustering upload before and
  after, against the paper layer's bytes.
- ``runs``: a few development cells run for FedClust's clustering round (stock Flower-style
  clients): with ``clusterfed.client.evidence_mod`` (the bytes really sent) and without the
  projection (before); on the same replies, the relative error of the pairwise cosine
  distances of each candidate layer (projected vs whole) and the ARI between the cut on the
  projected evidence and the cut on the whole evidence.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

import numpy as np  # noqa: E402
from sklearn.metrics import adjusted_rand_score  # noqa: E402

from clusterfed import protocol  # noqa: E402
from clusterfed.clustering.evidence_sketch import plan_bytes  # noqa: E402
from clusterfed.experiments.manifest import start_manifest, write_manifest  # noqa: E402
from clusterfed.experiments.settings import setting  # noqa: E402
from clusterfed.strategies import evidence_upload, strategy_class  # noqa: E402

HELD_OUT_START = 1000


def seeds(text: str) -> list[int]:
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        out.extend(range(int(first), int(last or first) + 1))
    if any(s >= HELD_OUT_START for s in out):
        raise SystemExit(f"bench_evidence_bytes: development seeds only (< {HELD_OUT_START})")
    return out


# ------------------------------------------------------------------------------ digits
def digits(out: Path) -> list[dict]:
    from clusterfed.config import parse_config
    from clusterfed.server_app import initial_arrays
    from clusterfed.simulation import simulate

    rows = []
    for sketch in (False, True):
        run_dir = out / "runs" / f"digits-sketch-{'on' if sketch else 'off'}"
        config = parse_config({**setting("digits-four-pairs-12"), "rounds": 1, "out-dir": str(run_dir),
                               "strategy": "fedclust", "fedclust.evidence-sketch": sketch})
        started = time.perf_counter()
        simulate(config, engine="inprocess", stream=None)
        record = json.loads(open(run_dir / "rounds.jsonl").readline())
        model = protocol.from_array_record(initial_arrays(config))
        rows.append({"part": "digits", "evidence_sketch": sketch, "clients": 12,
                     "clustering_bytes_per_client": record["clustering_bytes_up"] // 12,
                     "training_round_bytes_per_client": sum(a.nbytes for a in model.values()),
                     "paper_layer_bytes": model["fc2.weight"].nbytes + model["fc2.bias"].nbytes,
                     "ari": record.get("ari"), "clusters": record.get("num_clusters"),
                     "decision": record.get("decision"), "seconds": round(time.perf_counter() - started, 1)})
        shutil.rmtree(run_dir)  # the run's own files are not part of the results
    shutil.rmtree(out / "runs")
    return rows


# ------------------------------------------------------------------------------- draws
def draws(seed_list: list[int]) -> list[dict]:
    from fuzz.cell import draw_cell
    from fuzz.models import build_model

    rows = []
    for seed in seed_list:
        cell = draw_cell(seed)
        theta0 = {k: v.detach().cpu().numpy() for k, v in build_model(cell).state_dict().items()}
        for name in ("fedclust", "adacfl"):
            strategy = strategy_class(name)(evidence_sketch=True)
            strategy.init(theta0)
            choice, plan = strategy.state.layer_choice, strategy.state.evidence_plan
            whole = int(sum(theta0[k].nbytes for k in choice.keys))
            paper_rule = "final" if name == "fedclust" else "smallest-fc"
            paper = evidence_upload.paper_bytes(theta0, paper_rule, strategy.params.compare_arrays, choice.keys)
            after = plan_bytes(plan) if plan else whole
            rows.append({"part": "draws", "seed": seed, "strategy": name, "family": cell.family,
                         "candidate_layers": max(len(choice.candidates), 1), "before_bytes": whole,
                         "after_bytes": after, "paper_layer_bytes": paper, "within_paper": after <= paper,
                         "model_bytes": int(sum(a.nbytes for a in theta0.values()))})
    return rows


# -------------------------------------------------------------------------------- runs
def cosine_distances(X: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    U = X / np.where(norms == 0, 1, norms)
    return (1 - U @ U.T)[np.triu_indices(len(X), 1)]


def run_cell(seed: int, rounds: int) -> list[dict]:
    import torch
    from flwr.app import ArrayRecord, ConfigRecord
    from flwr.clientapp import ClientApp

    from clusterfed.client import evidence_mod
    from clusterfed.clustering import stack_partials
    from clusterfed.simulation import inprocess_grid
    from clusterfed.strategies import oneshot
    from fuzz.apps import stock_evaluate, stock_train
    from fuzz.cell import draw_cell
    from fuzz.models import build_model
    from fuzz.run import ari

    cell = draw_cell(seed)
    recorded: list[dict] = []
    original = evidence_upload.rows_input

    def recording(replies, start, keys, plan):  # the same replies, whole and projected
        out = original(replies, start, keys, plan)
        if plan and all(not r.is_update for r in replies):
            # what each client's arrays changed from the start model (a chained reply's ``update`` is
            # from the model it was sent: its previous reply)
            recorded.append({"whole": [{k: np.asarray(r.weights[k], np.float64) - np.asarray(start[k], np.float64)
                                        for k in keys} for r in replies],
                             "projected": out[0], "keys": list(keys)})
        return out

    rows = []
    for variant in ("before", "after-mod", "after-stock"):
        app = ClientApp(mods=[evidence_mod] if variant == "after-mod" else [])
        app.train()(stock_train)
        app.evaluate()(stock_evaluate)
        grid = inprocess_grid(app, cell.clients, run_config={"cell": cell.to_json(), "local-epochs": cell.local_epochs},
                              client_batching="off",
                              node_configs=[{"partition-id": i, "num-partitions": cell.clients}
                                            for i in range(cell.clients)])
        torch.manual_seed(cell.seed)
        model = build_model(cell)
        strategy = strategy_class("fedclust")(fraction_train=cell.participation,
                                              evidence_sketch=variant != "before")
        recorded.clear()
        evidence_upload.rows_input = recording
        logging.getLogger("flwr").setLevel(logging.WARNING)
        started = time.perf_counter()
        try:
            result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=rounds,
                                    train_config=ConfigRecord({"lr": cell.lr}))
        finally:
            evidence_upload.rows_input = original
        state = strategy.state
        theta0 = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
        clients = len(state.clustering_state.get("client_order", [])) or cell.clients
        row = {"part": "runs", "seed": seed, "variant": variant, "family": cell.family, "clients": cell.clients,
               "shift": cell.shift, "groups": cell.groups, "participation": cell.participation,
               "total_bytes_up": int(result.traffic["bytes_up"]), "model_bytes": int(sum(a.nbytes for a in theta0.values())),
               "plan_bytes_per_client": plan_bytes(state.evidence_plan) if state.evidence_plan else None,
               "chosen": state.layer_choice.chosen, "clusters": len(set(result.assignment.values())),
               "ari": ari(cell, result.assignment), "seconds": round(time.perf_counter() - started, 1)}
        if variant == "after-stock" and recorded:
            first = recorded[0]
            choice = copy.deepcopy(state.layer_choice)
            layers = {s["layer"] for s in choice.scores} or {choice.chosen}
            errors = {}
            candidates = oneshot_candidates(theta0, strategy)
            for layer, keys in candidates.items():
                whole = stack_partials([[u[k] for k in keys] for u in first["whole"]])
                proj = stack_partials([[u[k] for k in keys] for u in first["projected"]])
                dw, dp = cosine_distances(whole), cosine_distances(proj)
                errors[layer] = {"numbers_kept": int(proj.shape[1]), "numbers": int(whole.shape[1]),
                                 "median_rel_error": round(float(np.median(np.abs(dp - dw) / np.maximum(dw, 1e-12))), 4),
                                 "max_abs_error": round(float(np.max(np.abs(dp - dw))), 4)}
            chosen_keys = candidates.get(state.layer_choice.chosen) or state.layer_choice.keys
            whole = stack_partials([[u[k] for k in chosen_keys] for u in first["whole"]])
            proj = stack_partials([[u[k] for k in chosen_keys] for u in first["projected"]])
            lw, _ = oneshot.cut(whole, strategy.params)
            lp, _ = oneshot.cut(proj, strategy.params)
            row.update(layer_errors=errors, layers_scored=sorted(layers),
                       cut_ari_projected_vs_whole=round(float(adjusted_rand_score(lw, lp)), 4))
        rows.append(row)
    return rows


def oneshot_candidates(theta0, strategy) -> dict[str, list[str]]:
    """The candidate layers (layer -> keys) of the clustering round, as a fresh start has them."""
    fresh = strategy_class("fedclust")()
    fresh.init(theta0)
    return dict(fresh.state.layer_choice.candidates) or {fresh.state.layer_choice.chosen or "": fresh.state.layer_choice.keys}


def write_readme(out: Path, results: dict) -> None:
    lines = ["# Evidence without the bytes: FedClust's and AdaCFL's clustering upload", "",
             "FedClust's and AdaCFL's clustering round under `cluster-layers = auto` uploads every candidate "
             "layer once. Here each candidate array's update is projected by a seeded CountSketch the server "
             "shares (`clusterfed/clustering/evidence_sketch.py`), within the paper layer's bytes. Made by "
             "`benchmarks/bench_evidence_bytes.py` (command in `manifest.json`). Bytes are per client.", ""]
    digit_rows = results.get("digits", [])
    if digit_rows:
        lines += ["## The built-in digits CNN (12 clients, 4 label-pair groups, clusterfed's client)", "",
                  "| evidence-sketch | clustering upload (B/client) | training round (B/client) | share | paper layer (B) | ARI | clusters |",
                  "|---|---|---|---|---|---|---|"]
        for r in digit_rows:
            share = r["clustering_bytes_per_client"] / r["training_round_bytes_per_client"]
            lines.append(f"| {'on (after)' if r['evidence_sketch'] else 'off (before)'} | "
                         f"{r['clustering_bytes_per_client']:,} | {r['training_round_bytes_per_client']:,} | {share:.3f} | "
                         f"{r['paper_layer_bytes']:,} | {r['ari']} | {r['clusters']} |")
        lines.append("")
    draw_rows = results.get("draws", [])
    if draw_rows:
        lines += ["## Random model draws (development seeds, models only)", "",
                  "| strategy | draws | within the paper layer's bytes | before / model (median) | after / paper layer (median) | before (median B) | after (median B) |",
                  "|---|---|---|---|---|---|---|"]
        for name in ("fedclust", "adacfl"):
            rs = [r for r in draw_rows if r["strategy"] == name]
            if not rs:
                continue
            lines.append(f"| {name} | {len(rs)} | {sum(r['within_paper'] for r in rs)} of {len(rs)} | "
                         f"{np.median([r['before_bytes'] / r['model_bytes'] for r in rs]):.3f} | "
                         f"{np.median([r['after_bytes'] / r['paper_layer_bytes'] for r in rs]):.3f} | "
                         f"{int(np.median([r['before_bytes'] for r in rs])):,} | {int(np.median([r['after_bytes'] for r in rs])):,} |")
        lines.append("")
    run_rows = results.get("runs", [])
    if run_rows:
        lines += ["## FedClust's clustering round on development cells (stock Flower-style clients)", "",
                  "`before`: evidence-sketch off; `after-mod`: on, clients with `clusterfed.client.evidence_mod`; "
                  "`after-stock`: on, clients without the mod (projected on the server, no bytes saved). "
                  "Bytes: every upload of the run (the clustering round and round 1's training).", "",
                  "| seed | family | clients | variant | bytes up / client | plan B/client | chosen | clusters | ARI | cut ARI projected vs whole | median rel. error of cosine distances (chosen layer) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in run_rows:
            err = (r.get("layer_errors") or {}).get(r["chosen"] or "", {}).get("median_rel_error", "")
            lines.append(f"| {r['seed']} | {r['family']} | {r['clients']} | {r['variant']} | "
                         f"{r['total_bytes_up'] // r['clients']:,} | {r['plan_bytes_per_client'] or ''} | {r['chosen']} | "
                         f"{r['clusters']} | {r['ari']} | {r.get('cut_ari_projected_vs_whole', '')} | {err} |")
        lines.append("")
    (out / "README.md").write_text("\n".join(lines))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "evidence-bytes")
    parser.add_argument("--draws", default="0-199", help="development seeds whose models are drawn (no training)")
    parser.add_argument("--runs", default="0-3", help="development seeds run for FedClust's clustering round")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--skip-digits", action="store_true")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = start_manifest(vars(args) | {"out": str(args.out)},
                              ["benchmarks/bench_evidence_bytes.py", *(argv if argv is not None else sys.argv[1:])])
    path = args.out / "results.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    if not args.skip_digits:
        results["digits"] = digits(args.out)
    if args.draws:
        results["draws"] = draws(seeds(args.draws))
    if args.runs:
        results["runs"] = [row for seed in seeds(args.runs) for row in run_cell(seed, args.rounds)]
    path.write_text(json.dumps(results, indent=1, default=str))
    write_readme(args.out, results)
    write_manifest(args.out, manifest, parts=sorted(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
