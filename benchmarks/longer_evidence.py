"""Would a longer local training show the groups where one training's updates do not? A probe for
the CFL family's split test (``clusterfed.clustering.split_scores``), on fuzz cells
(``fuzz/cell.py``).

Per cell, from the start model (round 1) and from FedAvg's model after four rounds of every client
(round 5), each client's update of all its trainable arrays together, after the cell's own local
epochs E and after ``--factor`` × E: the best-cut silhouette of the updates under the cosine
distance (complete-linkage cuts into 2 to 6 clusters, as the CFL family's structure test scores
them), the same score's group-free Gaussian reference (the largest of ``--draws`` draws shaped
like the updates, ``clusterfed.clustering.null_reference``), and the ARI of that best cut against
the true groups. A grouped cell "shows" its groups at a length when the score beats the reference;
an IID control should never.

It reads the true groups (for the ARI), so no strategy could run it: it measures whether evidence
of that length would tell the groups apart, not how a strategy would gather it.

    PYTHONPATH=$PWD:$PWD/tests:$PWD/benchmarks python benchmarks/longer_evidence.py --held-out \\
        --seeds 1642,1696 --out benchmarks/results/model-fuzz/dev-longer-evidence

Writes ``evidence.json`` (per cell and length the four numbers), ``README.md`` (a row per cell and
the counts), ``evidence.png`` and ``manifest.json``. A cell already in ``evidence.json`` is not run
again.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "benchmarks")]

from sklearn.metrics import adjusted_rand_score  # noqa: E402

from clusterfed.clustering.null_reference import reference_score  # noqa: E402
from clusterfed.clustering.split_scores import (best_cut_labels, best_cut_silhouette,  # noqa: E402
                                                cosine_similarity_matrix)
from clusterfed.experiments.manifest import start_manifest, write_manifest  # noqa: E402
from model_fuzz import check_held_out, earlier_runs, parse_seeds  # noqa: E402

MAX_CLUSTERS = 6  # the CFL family's best cut looks at 2..6 clusters
ROUNDS = (1, 5)


def structure(U: np.ndarray, groups: list[int], draws: int, seed: int) -> dict[str, float]:
    """The rows ``U`` (one update per client): best-cut silhouette, its cut's size, the group-free
    Gaussian reference of the same score, and the cut's ARI against ``groups``."""
    score, clusters = best_cut_silhouette(cosine_similarity_matrix(U), MAX_CLUSTERS)
    reference = reference_score(U, lambda R: best_cut_silhouette(cosine_similarity_matrix(R), MAX_CLUSTERS)[0],
                                draws=draws, seed=seed)
    labels = best_cut_labels(cosine_similarity_matrix(U), MAX_CLUSTERS)
    return {"silhouette": round(score, 4), "clusters": clusters,
            "reference": None if reference is None else round(reference, 4),
            "ari": round(float(adjusted_rand_score(groups, labels)), 4)}


def shows(found: dict[str, float]) -> bool:
    """The best cut beats what group-free updates of the same shape reach."""
    return found["reference"] is not None and found["silhouette"] > found["reference"]


def cell_evidence(cell, factor: int, draws: int) -> dict:
    """``structure`` of every client's update after E and ``factor`` × E local epochs, at the
    rounds ``ROUNDS`` (FedAvg of every client's E-epoch update between them)."""
    import torch

    from fuzz.data import loaders, true_groups
    from fuzz.models import build_model
    from fuzz.signal import train

    torch.manual_seed(cell.seed)
    model = build_model(cell)
    groups = true_groups(cell)
    names = [n for n, p in model.named_parameters() if p.requires_grad]

    def updates(epochs: int) -> np.ndarray:
        start = {n: t.detach().clone() for n, t in model.state_dict().items()}
        rows = []
        for partition in range(cell.clients):
            local = copy.deepcopy(model)
            train(cell, local, loaders(cell, partition)[0], epochs, cell.lr)
            after = local.state_dict()
            rows.append(np.concatenate([(after[n] - start[n]).numpy().ravel() for n in names]))
        return np.stack(rows)

    found: dict[str, dict] = {}
    for server_round in range(1, max(ROUNDS) + 1):
        U = updates(cell.local_epochs)
        if server_round in ROUNDS:
            found[f"r{server_round}"] = {"E": structure(U, groups, draws, cell.seed),
                                         f"{factor}E": structure(updates(factor * cell.local_epochs), groups,
                                                                 draws, cell.seed)}
        state, mean, at = model.state_dict(), U.mean(axis=0), 0
        for n in names:  # FedAvg of the E-epoch updates (every client holds as many examples)
            size = state[n].numel()
            state[n] = state[n] + torch.from_numpy(mean[at:at + size]).view_as(state[n]).to(state[n].dtype)
            at += size
        model.load_state_dict(state)
    return {"label": cell.label(), "grouped": cell.shift != "iid", "local_epochs": cell.local_epochs, **found}


def counts(evidence: dict[str, dict], factor: int) -> dict[str, int]:
    """Grouped cells whose groups show (beat the reference with the cut's ARI >= 0.9) at some
    round, at E and at ``factor`` × E; IID controls that show any cut at either length."""
    long = f"{factor}E"

    def recovered(record: dict, length: str) -> bool:
        return any(shows(record[r][length]) and record[r][length]["ari"] >= 0.9 for r in record if r.startswith("r"))

    grouped = [e for e in evidence.values() if e["grouped"]]
    iid = [e for e in evidence.values() if not e["grouped"]]
    return {"grouped": len(grouped), "grouped_shown_E": sum(recovered(e, "E") for e in grouped),
            "grouped_shown_long": sum(recovered(e, long) for e in grouped),
            "iid": len(iid), "iid_shown_E": sum(any(shows(e[r]["E"]) for r in e if r.startswith("r")) for e in iid),
            "iid_shown_long": sum(any(shows(e[r][long]) for r in e if r.startswith("r")) for e in iid)}


def readme(evidence: dict[str, dict], factor: int, manifest: dict) -> str:
    long, n = f"{factor}E", counts(evidence, factor)

    def cell(found: dict) -> str:
        ref = "—" if found["reference"] is None else f"{found['reference']:.2f}"
        mark = " **shows**" if shows(found) else ""
        return f"{found['silhouette']:.2f} / {ref} (ARI {found['ari']:.2f}){mark}"

    rows = [f"| seed | cell | E | r1, E | r1, {long} | r5, E | r5, {long} |", "|---|---|---|---|---|---|---|"]
    for seed in sorted(evidence, key=int):
        e = evidence[seed]
        rows.append(f"| {seed} | {e['label']} | {e['local_epochs']} | {cell(e['r1']['E'])} | {cell(e['r1'][long])} | "
                    f"{cell(e['r5']['E'])} | {cell(e['r5'][long])} |")
    return f"""# Would a longer local training show the groups? (a probe)

`benchmarks/longer_evidence.py`: per cell, every client's update of all its trainable arrays,
from the start model (r1) and from FedAvg's model after four rounds of every client (r5), after
the cell's local epochs E and after {factor} × E. Each entry: the best-cut silhouette (cosine
distance, complete-linkage cuts into 2 to {MAX_CLUSTERS} clusters, the CFL family's structure score) / the
largest of {manifest['config']['draws']} group-free Gaussian draws of the same shape (its
reference), and the cut's ARI against the true groups; **shows** where the score beats the
reference. The probe reads the true groups; no strategy could run it.

- Grouped cells whose groups show (beat the reference, ARI ≥ 0.9) at r1 or r5: {n['grouped_shown_E']}
  of {n['grouped']} after E epochs, {n['grouped_shown_long']} of {n['grouped']} after {factor} × E.
- IID controls that show any cut: {n['iid_shown_E']} of {n['iid']} after E epochs,
  {n['iid_shown_long']} of {n['iid']} after {factor} × E.

Code: commit `{manifest.get('git', {}).get('commit', '?')}` (`manifest.json`: command, versions,
machine). The cells and why they were taken: `NOTES.md`.

![score against reference, E and {factor} × E](evidence.png)

{chr(10).join(rows)}
"""


def figure(evidence: dict[str, dict], factor: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    long = f"{factor}E"
    fig, ax = plt.subplots(figsize=(6.4, 5.2))
    for grouped, colour, name in ((True, "tab:blue", "grouped cell"), (False, "tab:red", "IID control")):
        xs, ys = [], []
        for e in evidence.values():
            if e["grouped"] != grouped:
                continue
            for r in ("r1", "r5"):
                a, b = e[r]["E"], e[r][long]
                if a["reference"] is not None and b["reference"] is not None:
                    xs.append(a["silhouette"] - a["reference"])
                    ys.append(b["silhouette"] - b["reference"])
        ax.scatter(xs, ys, c=colour, label=name, alpha=0.75)
    ax.axhline(0, color="grey", lw=0.8)
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_xlabel("best-cut silhouette − group-free reference, E epochs")
    ax.set_ylabel(f"the same, {factor} × E epochs")
    ax.set_title("above 0: the cut beats group-free updates (r1 and r5 per cell)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", required=True)
    parser.add_argument("--factor", type=int, default=4, help="the longer training's epochs, in multiples of E")
    parser.add_argument("--draws", type=int, default=19, help="group-free draws of the reference (19: a 5 %% test)")
    parser.add_argument("--held-out", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    check_held_out(seeds, args.held_out)  # before any work
    from fuzz.cell import draw_cell
    from model_matrix.cells import one_thread

    one_thread()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "evidence.json"
    evidence = json.loads(path.read_text()) if path.exists() else {}
    config = {"seeds": args.seeds, "factor": args.factor, "draws": args.draws, "rounds": list(ROUNDS)}
    manifest = start_manifest(config, ["benchmarks/longer_evidence.py", *(argv if argv is not None else sys.argv[1:])])
    started = time.perf_counter()
    todo = [s for s in seeds if str(s) not in evidence]
    for done, seed in enumerate(todo, 1):
        cell = draw_cell(seed)
        evidence[str(seed)] = cell_evidence(cell, args.factor, args.draws)
        path.write_text(json.dumps(evidence, indent=1))
        print(f"[{done}/{len(todo)}] {cell.label()} ({time.perf_counter() - started:.0f} s)", flush=True)
    write_manifest(args.out, manifest, config=config, earlier_runs=earlier_runs(args.out))
    figure(evidence, args.factor, args.out / "evidence.png")
    (args.out / "README.md").write_text(readme(evidence, args.factor, json.loads((args.out / "manifest.json").read_text())))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
