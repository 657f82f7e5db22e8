"""Every committed result under ``benchmarks/results/`` says what produced it.

A file is covered by the nearest ``manifest.json`` in its folder or a folder above it (below
``benchmarks/results/``); a loose file directly in ``benchmarks/results/`` by its entry in
``benchmarks/results/manifests.json`` (``{"files": {NAME: manifest}}``). A manifest names at
least the commit (``git.commit``, a hash or a list of hashes; or ``git.committed_in`` for one
reconstructed from history), the command (a string or a list of them) and a date (``started``,
``ended`` or ``date``, ISO 8601) — the fields ``clusterfed/experiments/manifest.py`` writes.
One written after the fact says so in ``reconstructed``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
LOOSE_MANIFESTS = RESULTS / "manifests.json"
HASH = re.compile(r"[0-9a-f]{7,40}")
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def manifest_problems(manifest: object) -> list[str]:
    """What a manifest lacks of commit, command and date (empty when it has all three)."""
    if not isinstance(manifest, dict):
        return ["not a JSON object"]
    problems = []
    git = manifest.get("git") if isinstance(manifest.get("git"), dict) else {}
    commit = git.get("commit") or git.get("committed_in")
    commits = commit if isinstance(commit, list) else [commit]
    if not commits or not all(isinstance(c, str) and HASH.fullmatch(c) for c in commits):
        problems.append(f"no commit (git.commit: {commit!r})")
    command = manifest.get("command")
    if not command or not (isinstance(command, str) or all(isinstance(c, str) and c for c in command)):
        problems.append("no command")
    date = next((manifest[k] for k in ("started", "ended", "date") if manifest.get(k)), None)
    if not (isinstance(date, str) and DATE.match(date)):
        problems.append("no date (started, ended or date)")
    return problems


def uncovered_files(results: Path) -> list[str]:
    """Result files with neither a manifest.json above them nor a loose-file entry."""
    loose = json.loads((results / "manifests.json").read_text())["files"] if (results / "manifests.json").exists() else {}
    out = []
    for path in sorted(p for p in results.rglob("*") if p.is_file()):
        if path.name == "manifest.json" or path == results / "manifests.json":
            continue
        if path.parent == results:
            if path.name not in loose:
                out.append(path.name)
            continue
        folder = path.parent
        while folder != results and not (folder / "manifest.json").exists():
            folder = folder.parent
        if folder == results:
            out.append(path.relative_to(results).as_posix())
    return out


def test_every_result_file_has_a_manifest():
    missing = uncovered_files(RESULTS)
    assert not missing, ("result files without a manifest (a manifest.json in their folder or above, or an entry "
                         f"in benchmarks/results/manifests.json for a loose file): {missing}")


def test_every_manifest_names_commit_command_and_date():
    problems = {}
    for path in sorted(RESULTS.rglob("manifest.json")):
        found = manifest_problems(json.loads(path.read_text()))
        if found:
            problems[path.relative_to(ROOT).as_posix()] = found
    for name, manifest in json.loads(LOOSE_MANIFESTS.read_text())["files"].items():
        assert (RESULTS / name).is_file(), f"benchmarks/results/manifests.json lists {name}, which is not there"
        found = manifest_problems(manifest)
        if found:
            problems[f"manifests.json: {name}"] = found
    assert not problems, f"incomplete manifests: {problems}"


def test_the_walk_finds_an_unlisted_file_and_an_incomplete_manifest(tmp_path):
    (tmp_path / "run" / "seed0").mkdir(parents=True)
    (tmp_path / "run" / "seed0" / "rounds.jsonl").write_text("{}\n")
    (tmp_path / "loose.json").write_text("{}")
    (tmp_path / "listed.json").write_text("{}")
    (tmp_path / "manifests.json").write_text(json.dumps({"files": {"listed.json": {}}}))
    assert uncovered_files(tmp_path) == ["loose.json", "run/seed0/rounds.jsonl"]
    (tmp_path / "run" / "manifest.json").write_text("{}")
    assert uncovered_files(tmp_path) == ["loose.json"]
    complete = {"git": {"commit": "42825b0425"}, "command": "clusterfed experiment x.toml", "started": "2026-11-24T05:50:23Z"}
    assert manifest_problems(complete) == []
    assert manifest_problems({**complete, "git": {"commit": None}}) == ["no commit (git.commit: None)"]
    assert manifest_problems({"git": {"committed_in": "abc1234"}, "command": ["a"], "date": "2026-11-22"}) == []
    assert len(manifest_problems({})) == 3
