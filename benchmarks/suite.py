"""The benchmark suite behind ``make bench`` / ``make bench-quick``: every strategy on every setting.

    python benchmarks/suite.py full  [--workers 2]   # make bench        (writes benchmarks/results/suite/)
    python benchmarks/suite.py quick [--workers 2]   # make bench-quick  (writes benchmarks/results/suite-quick/)

Each setting is one ``clusterfed compare`` grid (every strategy of
``clusterfed.strategies.REGISTRY`` × the profile's seeds, same partition per seed), run with
the in-process engine; all grids share one pool of ``--workers`` processes. Per setting the
folder ``<profile folder>/<setting>/`` gets ``comparison.csv``, ``comparison.md`` and the two
figures (the per-run folders ``<strategy>/seed<s>/`` are git-ignored). The full profile adds:

- ``digits-*``: scikit-learn digits, 20 clients, the seven non-IID settings in ``DIGITS``;
- ``mnist-*``: a 10,000-digit MNIST subset in torchvision's layout (``--data-dir``, the
  folder holding ``MNIST/raw``; default ``shared/data`` in the repository's parent folder,
  where CI places it; skipped with a message when absent), rotation 0/90/180/270 and
  digit pairs, 20 clients;
- ``ablation-all-layers-*``: FedClust and AdaCFL clustering on all layers instead of their
  partial weights (AdaCFL's Table 4 ablation), on digit pairs, label-swap and rotation.

``timing.json`` records the profile, its grid and the measured wall time. Afterwards run
``benchmarks/report.py`` (``make`` does) to regenerate the summary tables and the README.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
sys.path.insert(0, str(REPO))

from clusterfed.compare import Progress, build_grid, run_grid, write_outputs  # noqa: E402
from clusterfed.strategies import REGISTRY  # noqa: E402

DIGITS: dict[str, dict[str, object]] = {
    "pairs": {"partitioner": "label-groups", "label-groups": "0,1;2,3;4,5;6,7;8,9"},
    "shards": {"partitioner": "shards"},
    "label-swap": {"partitioner": "label-swap", "num-groups": 4},
    "rotation": {"partitioner": "rotation", "rotations": "0,90,180,270"},
    "dominant": {"partitioner": "dominant", "num-groups": 4, "alpha": 0.8},
    "dirichlet": {"partitioner": "dirichlet", "beta": 0.1},
    "iid": {"partitioner": "iid"},
}
MNIST: dict[str, dict[str, object]] = {
    "rotation": {"partitioner": "rotation", "rotations": "0,90,180,270"},
    "pairs": {"partitioner": "label-groups", "label-groups": "0,1;2,3;4,5;6,7;8,9"},
}
ABLATION_SETTINGS = ("pairs", "label-swap", "rotation")
ABLATION_STRATEGIES = ("fedclust", "adacfl")
COMMON = {"num-clients": 20, "checkpoint": False}

PROFILES: dict[str, dict[str, object]] = {
    "full": {"folder": "suite", "digits": tuple(DIGITS), "digits_rounds": 20, "digits_seeds": (0, 1),
             "mnist": tuple(MNIST), "mnist_rounds": 8, "mnist_seeds": (0,), "ablation": True},
    "quick": {"folder": "suite-quick", "digits": ("pairs", "rotation"), "digits_rounds": 5, "digits_seeds": (0,),
              "mnist": (), "mnist_rounds": 0, "mnist_seeds": (), "ablation": False},
}


def default_data_dir() -> Path:
    return REPO.parent / "shared" / "data"


def grids(profile: dict, data_dir: Path | None) -> list[tuple[str, dict, list[str], list[int]]]:
    """(setting folder name, base config values, strategies, seeds) per grid."""
    strategies = list(REGISTRY)
    out = []
    for name in profile["digits"]:
        base = {**COMMON, **DIGITS[name], "rounds": profile["digits_rounds"]}
        out.append((f"digits-{name}", base, strategies, list(profile["digits_seeds"])))
    if profile["mnist"]:
        if data_dir is None or not (data_dir / "MNIST" / "raw").is_dir():
            print(f"MNIST skipped: no MNIST/raw under {data_dir} (pass --data-dir)", file=sys.stderr)
        else:
            for name in profile["mnist"]:
                base = {**COMMON, **MNIST[name], "dataset": "mnist", "data-dir": str(data_dir.resolve()),
                        "rounds": profile["mnist_rounds"]}
                out.append((f"mnist-{name}", base, strategies, list(profile["mnist_seeds"])))
    if profile["ablation"]:
        for name in ABLATION_SETTINGS:
            base = {**COMMON, **DIGITS[name], "rounds": profile["digits_rounds"], "cluster-layers": "all"}
            out.append((f"ablation-all-layers-{name}", base, list(ABLATION_STRATEGIES), list(profile["digits_seeds"])))
    return out


def cost(config) -> float:
    """Rough relative cost, to start the longest runs first."""
    per_round = 8.0 if config.dataset == "mnist" else 1.0
    return per_round * config.rounds * (3.0 if config.strategy == "ifca" else 1.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", choices=tuple(PROFILES))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--data-dir", type=Path, default=default_data_dir(),
                        help="folder holding MNIST/raw (default: shared/data in the repository's parent folder)")
    parser.add_argument("--only", help="comma-separated setting folders to run (default: all)")
    args = parser.parse_args(argv)

    profile = PROFILES[args.profile]
    base_out = ROOT / "results" / str(profile["folder"])
    chosen = grids(profile, args.data_dir)
    if args.only:
        keep = set(args.only.split(","))
        chosen = [g for g in chosen if g[0] in keep]
    # every grid is built and checked before the first run
    planned = [(name, build_grid(base, strategies, seeds, base_out / name)) for name, base, strategies, seeds in chosen]
    flat = [(name, config) for name, configs in planned for config in configs]
    order = sorted(range(len(flat)), key=lambda i: -cost(flat[i][1]))
    print(f"{args.profile}: {len(planned)} settings, {len(flat)} runs, {args.workers} workers", file=sys.stderr)
    started = time.perf_counter()
    rows = run_grid([flat[i][1] for i in order], workers=args.workers, progress=Progress(len(flat)))
    by_index = dict(zip(order, rows))
    seconds = time.perf_counter() - started
    timing = {"profile": args.profile, "workers": args.workers, "runs": len(flat), "wall_seconds": round(seconds, 1),
              "settings": {}}
    timing_path = base_out / "timing.json"
    if args.only and timing_path.exists():  # a partial re-run keeps the other settings' record
        timing = json.loads(timing_path.read_text())
        timing.setdefault("partial_reruns", []).append({"only": args.only, "runs": len(flat),
                                                        "wall_seconds": round(seconds, 1)})
    for name, configs in planned:
        indices = [i for i, (n, _) in enumerate(flat) if n == name]
        setting_rows = [by_index[i] for i in indices]
        first = configs[0]
        title = f"{first.dataset} / {name.split('-', 1)[1]}, {first.num_clients} clients, {first.rounds} rounds"
        write_outputs(setting_rows, base_out / name, title)
        timing["settings"][name] = {"runs": len(configs), "rounds": first.rounds,
                                    "seeds": sorted({c.seed for c in configs}),
                                    "run_seconds_sum": round(sum(r["wall_seconds"] or 0 for r in setting_rows), 1)}
    timing_path.write_text(json.dumps(timing, indent=1) + "\n")
    print(f"{len(flat)} runs in {seconds / 60:.1f} min; tables under {base_out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
