"""Run every golden configuration (tests/golden/make_golden.py) into one folder each, or
compare two such sets of folders file by file with timings left out.

    python scripts/golden_run_folders.py run OUT            # with this checkout's code
    python scripts/golden_run_folders.py compare BEFORE AFTER > compare.json

``compare`` reports, per run, whether rounds.jsonl and clusters.json are equal once every
timing field is dropped, whether the checkpoint's arrays are equal (the .npz file is named by
the hash of its bytes), and which config keys summary.json gained, lost or changed.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMING = {"seconds", "timestamp", "time", "started", "updated", "finished", "elapsed"}


def untimed(value):
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items()
                if k not in TIMING and not k.endswith(("_seconds", "_s"))}
    if isinstance(value, list):
        return [untimed(v) for v in value]
    return value


def run(out: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests" / "golden"))
    from make_golden import BASE, RUNS

    from clusterfed.config import parse_config
    from clusterfed.simulation import simulate

    for name in RUNS:
        shutil.rmtree(out / name, ignore_errors=True)
        simulate(parse_config({**BASE, **RUNS[name], "out-dir": str(out / name)}), engine="inprocess", stream=None)


def compare(before: Path, after: Path) -> dict:
    report = {}
    for folder in sorted(p for p in before.iterdir() if p.is_dir()):
        other = after / folder.name
        rounds = [untimed(json.loads(line)) for line in (folder / "rounds.jsonl").read_text().splitlines()]
        rounds_after = [untimed(json.loads(line)) for line in (other / "rounds.jsonl").read_text().splitlines()]
        config, config_after = (json.loads((f / "summary.json").read_text())["config"] for f in (folder, other))
        report[folder.name] = {
            "rounds_equal": rounds == rounds_after,
            "clusters_equal": untimed(json.loads((folder / "clusters.json").read_text()))
            == untimed(json.loads((other / "clusters.json").read_text())),
            "checkpoint_arrays_equal": sorted(p.name for p in folder.glob("checkpoint-*.npz"))
            == sorted(p.name for p in other.glob("checkpoint-*.npz")),
            "config_keys_added": sorted(set(config_after) - set(config)),
            "config_keys_removed": sorted(set(config) - set(config_after)),
            "config_values_changed": sorted(k for k in set(config) & set(config_after)
                                            if config[k] != config_after[k] and k != "out-dir"),
        }
    return report


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(Path(sys.argv[2]))
    else:
        print(json.dumps(compare(Path(sys.argv[2]), Path(sys.argv[3])), indent=1))
