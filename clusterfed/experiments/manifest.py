"""``manifest.json``: what produced a result folder (code, configuration, software, machine, time).

    from clusterfed.experiments.manifest import start_manifest, write_manifest
    manifest = start_manifest(resolved_config)          # before the work
    ...                                                  # the work
    write_manifest(folder, manifest)                     # after it: end time and load added

Fields: ``git`` (commit and dirty flag of the checkout the package was imported from; the
dirty flag ignores ``benchmarks/results/``, which the work itself writes), ``config_hash``
(sha256 of the resolved configuration as canonical JSON), ``versions`` (flwr, torch, numpy,
scipy, scikit-learn, clusterfed, Python), ``machine`` (cores, usable cores, platform, load
average at start and end), ``command`` (the command line), ``started`` / ``ended`` (UTC,
ISO 8601) and ``wall_seconds``.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("flwr", "torch", "numpy", "scipy", "scikit-learn", "clusterfed")
REPO = Path(__file__).resolve().parents[2]


def config_hash(config: Any) -> str:
    """sha256 of ``config`` as canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _git(repo: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state(repo: str | Path = REPO) -> dict[str, Any]:
    """``{"commit", "dirty"}`` of the checkout at ``repo`` (default: the one clusterfed is
    imported from); both None outside a git checkout. Changes under benchmarks/results/ do
    not count as dirty."""
    commit = _git(Path(repo), "rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = _git(Path(repo), "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results")
    return {"commit": commit, "dirty": bool(status)}


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    out["python"] = platform.python_version()
    return out


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def start_manifest(config: Any, command: list[str] | None = None) -> dict[str, Any]:
    """Everything known before the work: code, configuration hash, software, machine, start."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count()
    return {
        "git": git_state(),
        "config_hash": config_hash(config),
        "versions": versions(),
        "machine": {"cores": os.cpu_count(), "usable_cores": usable, "platform": platform.platform(),
                    "load_average_start": _load()},
        "command": list(sys.argv if command is None else command),
        "started": _now(),
        "_t0": time.time(),
    }


def write_manifest(folder: str | Path, manifest: dict[str, Any], **extra: Any) -> Path:
    """``folder/manifest.json``: ``manifest`` with end time, wall time, load at the end and ``extra``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    record = {k: v for k, v in manifest.items() if not k.startswith("_")}
    record["machine"] = {**record["machine"], "load_average_end": _load()}
    record["ended"] = _now()
    record["wall_seconds"] = round(time.time() - manifest["_t0"], 1)
    record.update(extra)
    path = folder / "manifest.json"
    path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    return path
