"""Write benchmarks/results/arm64/{result.json,README.md} from what scripts/test-arm64.sh left in its cache.

    python scripts/arm64/report.py CACHE_DIR RESULTS_DIR
Every number comes from a file of that run: pip's --report, the wheels, `du -sb`, rounds.jsonl.
"""

from __future__ import annotations

import datetime
import json
import sys
import zipfile
from pathlib import Path

from clusterfed.experiments.manifest import git_state

cache, results = Path(sys.argv[1]), Path(sys.argv[2])
run = cache / "run"
MB = 1e6


def _read(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def _wheels(report_name: str, folder: Path) -> dict | None:
    """Packages of a pip --report with the size of their wheel and of its unpacked files."""
    report = _read(cache / report_name)
    if report is None:
        return None
    packages, download, unpacked = [], 0, 0
    for item in report["install"]:
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        url = item["download_info"]["url"]
        wheel = folder / url.rsplit("/", 1)[1]
        if url.startswith("file:"):  # the clusterfed wheel itself
            wheel = Path(url[len("file://"):].replace("/opt/dist", str(cache / "dist")))
        entry = {"name": name, "version": version}
        if wheel.exists():
            entry["wheel_bytes"] = wheel.stat().st_size
            entry["unpacked_bytes"] = sum(info.file_size for info in zipfile.ZipFile(wheel).infolist())
            download += entry["wheel_bytes"]
            unpacked += entry["unpacked_bytes"]
        packages.append(entry)
    packages.sort(key=lambda e: -e.get("unpacked_bytes", 0))
    cuda = [p["name"] for p in packages if p["name"].startswith(("nvidia", "cuda", "triton"))]
    return {"packages": len(packages), "download_bytes": download, "unpacked_bytes": unpacked,
            "cuda_packages": cuda, "ray": any(p["name"] == "ray" for p in packages),
            "largest": [f"{p['name']}=={p['version']} {p.get('unpacked_bytes', 0) / MB:.0f} MB" for p in packages[:6]]}


def _timings() -> dict:
    path = cache / "timings.txt"
    out = {}
    if path.exists():
        for line in path.read_text().split("\n"):
            if line.strip():
                name, seconds = line.split()
                out[name] = round(float(seconds), 1)
    return out


def _rounds(mode: str) -> dict | None:
    folder = run / f"out-{mode}"
    status = _read(folder / "status.json")
    if status is None:
        return None
    rounds = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines() if line.strip()] \
        if (folder / "rounds.jsonl").exists() else []
    summary = _read(folder / "summary.json") or {}
    keep = ("round", "round_seconds", "clients_trained", "clients_evaluated", "accuracy", "loss", "failures")
    return {"status": status.get("status"), "error": status.get("error"),
            "rounds": [{k: r[k] for k in keep if k in r} for r in rounds],
            "wall_seconds": summary.get("wall_seconds")}


def _models() -> dict | None:
    arm, x86 = _read(cache / "shapes-aarch64.json"), _read(cache / "shapes-x86_64.json")
    if arm is None or x86 is None:
        return None
    same_shapes = {k: arm["models"].get(k, {}).get("state_dict") == v["state_dict"] for k, v in x86["models"].items()}
    same_init = {k: arm["models"].get(k, {}).get("init_sha256") == v["init_sha256"] for k, v in x86["models"].items()}
    return {"device_torch": arm["torch"], "device_machine": arm["machine"], "server_torch": x86["torch"],
            "server_machine": x86["machine"], "models_compared": len(x86["models"]),
            "same_state_dict_names_shapes_dtypes": all(same_shapes.values()) and set(arm["models"]) == set(x86["models"]),
            "differing": sorted(k for k, ok in same_shapes.items() if not ok),
            "same_seeded_initial_weights": sum(same_init.values())}


def _text(path: Path) -> str | None:
    return path.read_text().strip() if path.exists() else None


def _commit() -> str:
    return (git_state(Path(__file__).resolve().parents[2])["commit"] or "")[:7]


timings = _timings()
venv_after = _text(cache / "venv-after.bytes")
x86_venv = _text(cache / "venv-x86_64.bytes")
native, emulated = _rounds("native"), _rounds("emulated")
result = {
    "what": "the device part of clusterfed (`pip install clusterfed`, no extras) on an emulated aarch64 "
            "device (Debian 12 arm64 rootfs, Python 3.11.2, qemu-user-static, QEMU_CPU=cortex-a72) and one "
            "round of a TLS federation with it",
    "date": datetime.date.today().isoformat(),
    "commit_at_measurement": _commit(),
    "host": "x86_64, 2 shared cores, Debian 12",
    "commands": ["make test-arm64   (= scripts/test-arm64.sh: setup rootfs install before x86 models native emulated)"],
    "install_aarch64_after": {
        "what": "what pyproject's markers select on aarch64 (see freeze: torch, torchvision CPU wheels)",
        "venv_bytes": int(venv_after) if venv_after else None,
        "freeze": (_text(cache / "freeze-after.txt") or "").split("\n"),
        "largest_in_site_packages": (_text(cache / "largest-after.txt") or "").split("\n"),
        **(_wheels("report-after.json", cache / "wheels") or {}),
    },
    "install_aarch64_before": {
        "what": "what the previous pins (torch==2.14.1, torchvision==0.29.1) resolve to on the same device: "
                "resolved there by pip --dry-run --report, wheels downloaded and their unpacked size summed "
                "on the host (not installed under qemu)",
        **(_wheels("report-before.json", cache / "wheels-before") or {}),
    },
    "install_x86_64": {
        "what": "the device part on the x86_64 host (pins unchanged there: torch==2.14.1, a CUDA build on PyPI)",
        "venv_bytes": int(x86_venv) if x86_venv else None,
        "freeze_torch": [line for line in (_text(cache / "freeze-x86_64.txt") or "").split("\n")
                         if line.startswith(("torch", "nvidia", "ray"))],
    },
    "models": _models(),
    "compute": {"what": "40 SGD steps of digits-cnn, batch 16, 1 torch thread (scripts/arm64/compute_bench.py)",
                "emulated": _read(cache / "compute-aarch64.json"), "native": _read(cache / "compute-x86_64.json")},
    "timings_seconds": timings,
    "run": {
        "config": "fedavg, rounds=1, digits, label-groups 0,1;2,3, 3 clients, TLS SuperLink on 127.0.0.1",
        "native": native,
        "emulated": emulated,
    },
}
native_round = (native or {}).get("rounds", [{}])[0].get("round_seconds") if native and native["rounds"] else None
emulated_round = (emulated or {}).get("rounds", [{}])[0].get("round_seconds") if emulated and emulated["rounds"] else None
if native_round and emulated_round:
    result["run"]["round_seconds_native"] = native_round
    result["run"]["round_seconds_with_emulated_device"] = emulated_round
    result["run"]["ratio"] = round(emulated_round / native_round, 1)
if result["compute"]["emulated"] and result["compute"]["native"]:
    result["compute"]["ratio"] = round(result["compute"]["emulated"]["ms_per_step"]
                                       / result["compute"]["native"]["ms_per_step"], 1)
results.mkdir(parents=True, exist_ok=True)
(results / "result.json").write_text(json.dumps(result, indent=1) + "\n")


def _torch(install):
    return next((line.split("==")[1] for line in install.get("freeze", []) if line.startswith("torch==")), "—")


def gb(value):
    return "—" if not value else f"{value / 1e9:.2f} GB" if value >= 1e9 else f"{value / MB:.0f} MB"


after, before = result["install_aarch64_after"], result["install_aarch64_before"]
models = result["models"] or {}
lines = [
    "# arm64 device check (`make test-arm64`)",
    "",
    f"Measured {result['date']} on {result['host']} (commit {result['commit_at_measurement']} + the "
    "working tree of that run), by `scripts/test-arm64.sh`; every number below is in `result.json`.",
    "The device is a Debian 12 arm64 rootfs run with qemu-user (`QEMU_CPU=cortex-a72`, a Raspberry Pi 4's",
    "core), Python 3.11.2, a venv with `pip install clusterfed-0.1.0-py3-none-any.whl` (no extras).",
    "",
    "## Install size on aarch64",
    "",
    "| | torch | packages | download | unpacked | CUDA packages | Ray |",
    "| --- | --- | --- | --- | --- | --- | --- |",
    f"| before (torch 2.14.1 pins) | 2.14.1 | {before.get('packages', '—')} | {gb(before.get('download_bytes'))} | "
    f"{gb(before.get('unpacked_bytes'))} | {len(before.get('cuda_packages', []))} | {before.get('ray')} |",
    f"| after (aarch64 markers) | {_torch(after)} | {after.get('packages', '—')} | {gb(after.get('download_bytes'))} | "
    f"{gb(after.get('unpacked_bytes'))} | {len(after.get('cuda_packages', []))} | {after.get('ray')} |",
    "",
    f"The installed venv on the device (`du -sb`, with bytecode): **{gb(after.get('venv_bytes'))}**. "
    f"On the x86_64 host the same wheel installs torch 2.14.1 (CUDA build): "
    f"{gb(result['install_x86_64']['venv_bytes'])} venv.",
    "",
    "Largest after: " + "; ".join(after.get("largest", [])),
    "",
    "Largest before: " + "; ".join(before.get("largest", [])),
    "",
    "## Same models on both torch releases",
    "",
    f"{models.get('models_compared', '—')} (model, data set) pairs built with torch {models.get('device_torch')} "
    f"({models.get('device_machine')}) and {models.get('server_torch')} ({models.get('server_machine')}): "
    f"state_dict names, shapes and dtypes identical: **{models.get('same_state_dict_names_shapes_dtypes')}**; "
    f"seeded initial weights bit-identical in {models.get('same_seeded_initial_weights')} of them "
    "(informative: the server sends θ0 to every client).",
    "",
    "## One round with the emulated device",
    "",
    "FedAvg, 1 round, digits split by `label-groups` `0,1;2,3` into 3 clients, TLS SuperLink and "
    "the ServerApp on the host. *native*: three native SuperNodes; *emulated*: client 0 on the emulated "
    "aarch64 device, clients 1–2 native. Round 1 includes each device's warm-worker start (importing torch).",
    "",
    "| run | status | round 1 (s) | whole `flwr run` (s) |",
    "| --- | --- | --- | --- |",
]
for mode, data in (("native", native), ("emulated", emulated)):
    if data:
        first = data["rounds"][0] if data["rounds"] else {}
        seconds = first.get("round_seconds")
        lines.append(f"| {mode} | {data['status']} | {seconds:.1f} | {timings.get('run_' + mode, '—')} |" if seconds
                     else f"| {mode} | {data['status']} | — | {timings.get('run_' + mode, '—')} |")
if "ratio" in result["run"]:
    lines += ["", f"Round time with the emulated device / native: **{result['run']['ratio']}×**. A round is "
              "mostly fixed costs (Flower's polling, a fresh `flwr-clientapp` process per message, the "
              "warm worker's start); the round waits for its slowest client."]
compute = result["compute"]
if "ratio" in compute:
    lines += ["", f"Pure computation ({compute['what']}): {compute['emulated']['ms_per_step']} ms per step "
              f"emulated vs {compute['native']['ms_per_step']} ms native, **{compute['ratio']}×** (qemu-user on "
              "this host; a real Pi 4 is another matter: not measured)."]
lines += [
    "",
    "## Durations of the steps (s)",
    "",
    ", ".join(f"{k} {v}" for k, v in timings.items()),
    "",
    "`resolve_*`: pip's dry-run resolution on the emulated device (index pages and metadata through "
    "emulated TLS); `install_after`: `pip install --no-index --find-links` there from wheels the host "
    "downloaded; `install_x86_64`: the same wheel into a fresh venv on the host.",
    "",
]
(results / "README.md").write_text("\n".join(lines))
print(json.dumps({k: result[k] for k in ("models",)}, indent=1))
print(json.dumps(result["run"], indent=1)[:3000])
