"""Summarise benchmarks/results/selection-guard/ (or selection-per-seed/): per grid folder and
selection variant, the final accuracy (mean ± std over seeds, and the minimum over seeds beside
it), its gap to FedAvg's on the same seed (mean and worst seed), the transmissions as a share of
FedAvg's (mean and largest), and how many seeds hold on their own (within 2 pp of FedAvg at no more
than 60 % of its transmissions), read from each folder's comparison.csv.

    python benchmarks/selection_guard_summary.py [benchmarks/results/selection-guard]

Writes summary.md (and the same numbers as plain data, summary.json) beside the grid folders
and prints the table.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from clusterfed.experiments.stats import MeanStd, mean_std

GOAL_GAP = -0.02  # at most 2 percentage points below FedAvg
GOAL_SHARE = 0.60  # at most 60 % of FedAvg's transmissions


def rows_by_strategy(folder: Path) -> dict[str, dict[int, dict]]:
    out: dict[str, dict[int, dict]] = {}
    with open(folder / "comparison.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            if row.get("final_accuracy"):
                out.setdefault(row["strategy"], {})[int(row["seed"])] = row
    return out


def grid_summary(folder: Path) -> dict:
    """The table's numbers as plain data (fractions, not percent): FedAvg's final accuracy and
    transmissions, and per variant its accuracy, gap to FedAvg (mean, worst seed) and share of
    FedAvg's transmissions (mean, largest)."""
    runs = rows_by_strategy(folder)
    fedavg = runs.pop("fedavg")
    seeds = sorted(fedavg)
    base = mean_std(float(fedavg[s]["final_accuracy"]) for s in seeds)
    out = {"seeds": seeds, "fedavg": {"final_accuracy_mean": base.mean, "final_accuracy_std": base.std,
                                      "transmissions": float(fedavg[seeds[0]]["transmissions"])}, "variants": {}}
    for name, by_seed in sorted(runs.items()):
        common = [s for s in seeds if s in by_seed]
        gaps = [float(by_seed[s]["final_accuracy"]) - float(fedavg[s]["final_accuracy"]) for s in common]
        shares = [float(by_seed[s]["transmissions"]) / float(fedavg[s]["transmissions"]) for s in common]
        worst = min(range(len(gaps)), key=gaps.__getitem__)
        finals = [float(by_seed[s]["final_accuracy"]) for s in common]
        acc = mean_std(finals)
        lowest = min(range(len(finals)), key=finals.__getitem__)
        holds = [s for s, g, x in zip(common, gaps, shares) if g >= GOAL_GAP and x <= GOAL_SHARE]
        # the mean of the last 10 rounds (selection_per_seed's last10_accuracy), where both runs have it:
        # the final round is one draw of a curve that swings by several points from round to round
        both = [s for s in common if by_seed[s].get("last10_accuracy") and fedavg[s].get("last10_accuracy")]
        gaps10 = [float(by_seed[s]["last10_accuracy"]) - float(fedavg[s]["last10_accuracy"]) for s in both]
        last10 = ({"last10_seeds": both, "last10_gap_mean": sum(gaps10) / len(gaps10), "last10_gap_worst": min(gaps10),
                   "last10_gap_worst_seed": both[gaps10.index(min(gaps10))],
                   "last10_seeds_within": sum(1 for g in gaps10 if g >= GOAL_GAP)} if both else {})
        out["variants"][name] = {**last10, "final_accuracy_mean": acc.mean, "final_accuracy_std": acc.std,
                                 "final_accuracy_min": finals[lowest], "final_accuracy_min_seed": common[lowest],
                                 "seeds_holding": len(holds), "seeds_failing": [s for s in common if s not in holds],
                                 "gap_mean": sum(gaps) / len(gaps), "gap_worst": gaps[worst],
                                 "gap_worst_seed": common[worst], "share_mean": sum(shares) / len(shares),
                                 "share_max": max(shares), "seeds": common}
    return out


def grid_table(name: str, summary: dict) -> list[str]:
    """``grid_summary``'s numbers as the Markdown table of summary.md."""
    fedavg, seeds = summary["fedavg"], summary["seeds"]
    base = MeanStd(fedavg["final_accuracy_mean"], fedavg["final_accuracy_std"], len(seeds), len(seeds))
    lines = [f"### {name}", "",
             f"FedAvg: final accuracy {base.format()}, {fedavg['transmissions']:.0f} transmissions "
             f"per run; seeds {', '.join(map(str, seeds))}.", "",
             "| variant | final acc | lowest seed | gap to FedAvg, mean (pp) | worst seed (pp) | transmissions, % of "
             "FedAvg (mean / largest) | mean gap ≥ −2 pp and ≤ 60 % | every seed ≥ −2 pp | seeds within 2 pp at ≤ 60 % | "
             "last 10 rounds' mean: gap, mean / worst seed (pp); seeds within 2 pp |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for variant, v in summary["variants"].items():
        acc = MeanStd(v["final_accuracy_mean"], v["final_accuracy_std"], len(v["seeds"]), len(v["seeds"]))
        meets = v["gap_mean"] >= GOAL_GAP and v["share_mean"] <= GOAL_SHARE
        lowest = (f"{v['final_accuracy_min']:.3f} (seed {v['final_accuracy_min_seed']})"
                  if "final_accuracy_min" in v else "–")
        holding = (f"{v['seeds_holding']} of {len(v['seeds'])}" + (
            f" (not: {', '.join(map(str, v['seeds_failing']))})" if v.get("seeds_failing") else "")
            if "seeds_holding" in v else "–")
        lines.append(f"| {variant} | {acc.format()} | {lowest} | {100 * v['gap_mean']:+.1f} | {100 * v['gap_worst']:+.1f} "
                     f"(seed {v['gap_worst_seed']}) | {100 * v['share_mean']:.0f} / {100 * v['share_max']:.0f} | "
                     f"{'yes' if meets else 'no'} | {'yes' if v['gap_worst'] >= GOAL_GAP else 'no'} | {holding} | "
                     + (f"{100 * v['last10_gap_mean']:+.1f} / {100 * v['last10_gap_worst']:+.1f} (seed "
                        f"{v['last10_gap_worst_seed']}); {v['last10_seeds_within']} of {len(v['last10_seeds'])} |"
                        if v.get("last10_seeds") else "– |"))
    return lines + [""]


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).parent / "results" / "selection-guard"
    folders = sorted(p for p in root.iterdir() if (p / "comparison.csv").exists())
    lines = ["# Client selection: the paper's p (paper-*) and the floor (floor-*) beside FedAvg", "",
             "Generated by benchmarks/selection_guard_summary.py from each folder's comparison.csv. Gap: final "
             "accuracy minus FedAvg's on the same seed; transmissions: client replies to training messages; "
             "last 10 rounds' mean: where both runs' rounds were kept (selection_per_seed's last10_accuracy).", ""]
    summary = {folder.name: grid_summary(folder) for folder in folders}
    for name, grid in summary.items():
        lines += grid_table(name, grid)
    write_summary(root, "\n".join(lines), summary)
    return 0


def write_summary(root: Path, text: str, summary: dict) -> None:
    """``root``'s summary.md (``text``, also printed) and summary.json (``summary``)."""
    (root / "summary.md").write_text(text)
    (root / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
