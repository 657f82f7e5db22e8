"""Record checkpoints written by this version of clusterfed, and the round each resumes into,
so a later version can be checked to resume them unchanged (tests/test_golden.py).

    python tests/golden/make_checkpoints.py tests/golden/checkpoints [name ...]

For each golden run (``make_golden.RUNS``) named in ``CHECKPOINTED``: the run stopped one round
early (its checkpoint is kept under ``<target>/<name>/``), then resumed for its last round;
that round's numbers and the final assignment go to ``<target>/resumed.json``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from make_golden import BASE, FIELDS, RUNS  # noqa: E402

# one per family of state: bi-partitioning (tree, merges), stability windows, one-shot
# clustering (references, kept partials), the adaptive threshold
CHECKPOINTED = ("cfl-merge", "hicfl", "fedclust", "adacfl")


def config_of(name: str, out: Path, **overrides) -> dict:
    return {**BASE, **RUNS[name], "out-dir": str(out), **overrides}


def run(config: dict) -> Path:
    from clusterfed.config import parse_config
    from clusterfed.simulation import simulate

    simulate(parse_config(config), engine="inprocess", stream=None)
    return Path(config["out-dir"])


def last_round(out: Path) -> dict:
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    clusters = json.loads((out / "clusters.json").read_text())
    return {"round": {k: rounds[-1][k] for k in FIELDS}, "assignment": clusters["assignment"]}


def resume(name: str, checkpoint: Path, out: Path, **overrides) -> dict:
    """The last round of ``name`` resumed from the checkpoint in ``checkpoint`` (copied into ``out``),
    with the run's config changed by ``overrides``."""
    shutil.copytree(checkpoint, out)
    rounds = config_of(name, out)["rounds"]
    return last_round(run(config_of(name, out, **{"resume-from": str(out), **overrides}, rounds=rounds)))


def record(name: str, target: Path) -> dict:
    rounds = config_of(name, target)["rounds"]
    with tempfile.TemporaryDirectory() as tmp:
        early = run(config_of(name, Path(tmp) / "early", rounds=rounds - 1))
        keep = target / name
        shutil.rmtree(keep, ignore_errors=True)
        keep.mkdir(parents=True)
        for path in early.glob("checkpoint*"):
            shutil.copy(path, keep / path.name)
        (keep / "rounds.jsonl").write_text((early / "rounds.jsonl").read_text())  # the recorder resumes it
        return resume(name, keep, Path(tmp) / "resumed")


if __name__ == "__main__":
    target = Path(sys.argv[1])
    names = sys.argv[2:] or list(CHECKPOINTED)
    results_file = target / "resumed.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    for name in names:
        results[name] = {**record(name, target), "written_by_commit": commit}
        print(name, results[name]["round"]["num_clusters"], "clusters", flush=True)
    results_file.write_text(json.dumps(results, indent=1, sort_keys=True))
