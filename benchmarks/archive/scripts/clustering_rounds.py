"""Rounds to the clustering, from a grid's run folders (``benchmarks/archive/scripts/grid.py`` keeps them
under ``results/<name>/runs/``): per setting and strategy, mean ± std over seeds of

- ``first_ari_095``: the first round whose ARI against the true groups is ≥ 0.95 (the
  correct clustering reached; "–" when never);
- ``last_change``: the round of the last split or merge (``final_clustering_round``).

    python benchmarks/archive/scripts/clustering_rounds.py hierarchical_defaults_digits [strategy ...]

Prints a markdown table. HiCFL's claim (Gong et al.): it reaches its clustering in 27–80 %
fewer rounds than CFL.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from grid import mean_std  # noqa: E402


def main(argv: list[str]) -> int:
    name, wanted = argv[0], set(argv[1:])
    cells: dict[tuple[str, str], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for run in sorted((ROOT / "results" / name / "runs").iterdir()):
        setting, strategy, _seed = run.name.split("__")
        if wanted and strategy not in wanted:
            continue
        rounds = [json.loads(line) for line in (run / "rounds.jsonl").read_text().splitlines() if line.strip()]
        clusters = json.loads((run / "clusters.json").read_text())
        first = next((r["round"] for r in rounds if r.get("ari") is not None and r["ari"] >= 0.95), None)
        cells[(setting, strategy)]["first_ari_095"].append(first)
        cells[(setting, strategy)]["last_change"].append(clusters.get("final_clustering_round"))
    print("| setting | strategy | first round with ARI ≥ 0.95 | round of the last split/merge |")
    print("|---|---|---|---|")
    for (setting, strategy), values in sorted(cells.items()):
        print(f"| {setting} | {strategy} | {mean_std(values['first_ari_095'])} | {mean_std(values['last_change'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
