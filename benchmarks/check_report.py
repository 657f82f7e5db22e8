"""``make check-report``: a short FedClust run on the built-in digits task with every log-to
destination installed, its HTML report checked for self-containment and rendered in headless
Chromium. Writes benchmarks/results/report/: report.html (the run's report), screenshot.png,
result.json (what was checked and found) and manifest.json."""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from clusterfed.experiments.settings import SETTINGS

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "report"
# the digits-pairs setting of the settings registry (FedClust, 8 rounds)
RUN = {"strategy": "fedclust", "rounds": 8, **SETTINGS["digits-pairs"], "seed": 0, "checkpoint": False}
WIDTH, HEIGHT = 1280, 2000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--rounds", type=int, default=RUN["rounds"])
    args = parser.parse_args()

    from PIL import Image

    from clusterfed.config import parse_config
    from clusterfed.experiments.manifest import start_manifest, write_manifest
    from clusterfed.report import LOG_TO, write_report
    from clusterfed.report.audit import audit, find_chromium, screenshot
    from clusterfed.report.watchers import EXTRAS
    from clusterfed.simulation import simulate

    chromium = find_chromium()
    if chromium is None:
        print("check-report: no chromium on PATH (Debian: apt-get install chromium)", file=sys.stderr)
        return 2
    log_to = [name for name in LOG_TO if importlib.util.find_spec(EXTRAS[name][0]) is not None]
    with tempfile.TemporaryDirectory(prefix="clusterfed-check-report-") as scratch:
        run_dir = Path(scratch) / "run"
        values = {**RUN, "rounds": args.rounds, "out-dir": str(run_dir), "log-to": ",".join(log_to)}
        manifest = start_manifest(values, command=["make", "check-report"])
        summary = simulate(parse_config(values), engine="inprocess", stream=None)
        written_by_run = (run_dir / "report.html").stat().st_size
        started = time.perf_counter()
        report = write_report(run_dir)  # what `clusterfed report OUT_DIR` does
        draw_seconds = time.perf_counter() - started
        text = report.read_text()
        found = audit(text)
        pngs = found.pngs()
        assignment = json.loads((run_dir / "clusters.json").read_text())["assignment"]
        args.out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(report, args.out / "report.html")
        shot = screenshot(report, args.out / "screenshot.png", WIDTH, HEIGHT)
        gray = Image.open(shot).convert("L")
        version = subprocess.run([chromium, "--version"], capture_output=True, text=True).stdout.strip()
        event_files = sorted(p.name for p in (run_dir / "tensorboard").glob("events.out.tfevents.*"))
        mlflow_metrics = sorted(p.name for p in (run_dir / "mlruns").rglob("metrics/*")) if "mlflow" in log_to else []
    clients_listed = sorted(found.clients)
    checks = {
        "no_external_urls": found.external_urls() == [],
        "every_image_a_png": len(pngs) == len(found.images) >= 4,
        "every_client_listed": clients_listed == sorted(assignment),
        "screenshot_size": list(gray.size) == [WIDTH, HEIGHT],
        "screenshot_not_blank": gray.getextrema()[1] - gray.getextrema()[0] > 100,
        "tensorboard_written": bool(event_files) if "tensorboard" in log_to else None,
        "mlflow_written": bool(mlflow_metrics) if "mlflow" in log_to else None,
    }
    result = {
        "run": {**{k: v for k, v in values.items() if k != "out-dir"}, "final_accuracy": summary["final_accuracy"],
                "final_ari": summary["final_ari"], "num_clusters": summary["num_clusters"],
                "wall_seconds": summary["wall_seconds"]},
        "report": {"bytes": len(text.encode()), "kb": round(len(text.encode()) / 1024, 1),
                   "bytes_written_by_run": written_by_run, "images": len(pngs),
                   "image_bytes": [len(p) for p in pngs], "external_urls": len(found.external_urls()),
                   "clients_listed": len(clients_listed), "clients_assigned": len(assignment),
                   "draw_seconds": round(draw_seconds, 2)},
        "render": {"chromium": version, "screenshot": "screenshot.png", "width": gray.size[0],
                   "height": gray.size[1], "gray_range": list(gray.getextrema())},
        "log_to": log_to,
        "tensorboard_event_files": len(event_files),
        "mlflow_metric_series": len(mlflow_metrics),
        "checks": checks,
        "ok": all(v is not False for v in checks.values()),
    }
    (args.out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    write_manifest(args.out, manifest)
    print(json.dumps(checks, indent=1))
    print(f"check-report: {'ok' if result['ok'] else 'FAILED'}; {args.out}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
