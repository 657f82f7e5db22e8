"""Install sizes: what each install of clusterfed puts on disk, before and after torch became an
extra, and the check that `pip install clusterfed` leaves a Flower 1.42 install alone.

    python benchmarks/bench_install_size.py [--out benchmarks/results/install]

Each install (a pip requirement set) is resolved by pip for this machine (`pip install --dry-run
--ignore-installed --report`, with constraints.txt's versions where they apply), and its size is
the sum, over the resolved distributions, of the files each one has on disk here (its RECORD,
compiled .pyc included), read from venvs on this machine that hold that exact version
(--site-packages; by default .venv, .venv-compat-*). "before" resolves the pyproject.toml of
--before (a git revision: torch and flwr==1.41.0 in the core). Real installs check the method:
the server install into an empty venv (du of its site-packages), and the Flower 1.42 check.
Writes sizes.json, sizes.md and manifest.json.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clusterfed.experiments.manifest import start_manifest, write_manifest  # noqa: E402

CPU_TORCH = ["torch==2.13.0+cpu", "torchvision==0.28.0"]  # the CPU-only wheels (what the lean images use)
# name -> (what it is, requirement on the project, extra requirements, use constraints.txt's torch)
INSTALLS = {
    "server": ("a ServerApp of your own / Flower app server side: pip install clusterfed", "", [], True),
    "server-builtin": ("the built-in ServerApp and CLI: clusterfed[server] (PyPI torch)", "[server]", [], True),
    "server-builtin-cpu": ("clusterfed[server] with the CPU-only torch wheel", "[server]", CPU_TORCH, False),
    "device": ("a device with the built-in task: clusterfed[torch] (PyPI torch)", "[torch]", [], True),
    "device-cpu": ("clusterfed[torch] with the CPU-only torch wheel", "[torch]", CPU_TORCH, False),
    "dev": ("everything and the test tools: clusterfed[dev]", "[dev]", [], True),
}
# the same roles before: the device took the core (torch included), the server the [server] extra
BEFORE = {"server": "[server]", "device": "", "dev": "[dev]"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_sizes(site_packages: list[Path]) -> dict[tuple[str, str], int]:
    """(name, version) -> bytes on disk of every file of that distribution, per venv found first."""
    sizes: dict[tuple[str, str], int] = {}
    for folder in site_packages:
        for dist in metadata.distributions(path=[str(folder)]):
            key = (canonical(dist.metadata["Name"]), dist.version)
            if key in sizes or not dist.files:
                continue
            total = 0
            for file in dist.files:
                path = Path(dist.locate_file(file))
                if path.is_file():
                    total += path.stat().st_size
            sizes[key] = total
    return sizes


def resolve(python: str, project: Path, extra: str, more: list[str], constraints: Path | None) -> list[tuple[str, str]]:
    """The distributions pip would install for project[extra] + more into an empty environment."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        command = [python, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed", "--report", str(report),
                   f"{project}{extra}", *more]
        if constraints is not None:
            command += ["-c", str(constraints)]
        subprocess.run(command, check=True, capture_output=True, text=True)
        items = json.loads(report.read_text())["install"]
    return sorted((canonical(i["metadata"]["name"]), i["metadata"]["version"]) for i in items)


def measure(resolved, sizes, project_name="clusterfed") -> dict:
    missing = [f"{n}=={v}" for n, v in resolved if (n, v) not in sizes and n != project_name]
    parts = {n: sizes.get((n, v), 0) for n, v in resolved if n != project_name}
    largest = sorted(parts.items(), key=lambda kv: -kv[1])[:6]
    return {"bytes": sum(parts.values()), "distributions": len(resolved),
            "has_torch": any(n == "torch" for n, _ in resolved),
            "versions": {n: v for n, v in resolved if n in ("flwr", "torch", "ray")},
            "largest_mb": {n: round(b / 1e6, 1) for n, b in largest}, "unmeasured": missing}


def du(folder: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(folder)], check=True, capture_output=True, text=True).stdout.split()[0])


def real_install(python: str, steps: list[list[str]], tmp: Path, name: str) -> dict:
    """A fresh venv, the pip steps in order; its site-packages' size and what it holds."""
    venv = tmp / name
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin/python"), "-m", "pip", "install", "-q"]
    for step in steps:
        subprocess.run(pip + step, check=True, capture_output=True, text=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    held = {canonical(d.metadata["Name"]): d.version for d in metadata.distributions(path=[str(site)])}
    return {"commands": [" ".join(["pip install", *s]) for s in steps], "site_packages_bytes": du(site),
            "flwr": held.get("flwr"), "torch": held.get("torch"), "distributions": len(held)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/install"))
    parser.add_argument("--before", default="main", help="git revision whose pyproject.toml is 'before'")
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose pip resolves")
    parser.add_argument("--site-packages", nargs="*", default=None)
    args = parser.parse_args()
    manifest = start_manifest(vars(args))
    folders = [Path(p) for p in args.site_packages] if args.site_packages else [
        *(ROOT.glob(".venv/lib/python*/site-packages")), *(ROOT.glob(".venv-compat-*/lib/python*/site-packages"))]
    constraints = ROOT / "constraints.txt"
    resolved: dict = {"after": {}, "before": {}}
    results: dict = {"after": {}, "before": {}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        no_torch_pins = tmp / "constraints-no-torch.txt"
        no_torch_pins.write_text("".join(line + "\n" for line in constraints.read_text().splitlines()
                                         if not re.match(r"(torch|torchvision|triton|nvidia-|cuda-)", line)))
        for name, (what, extra, more, pinned_torch) in INSTALLS.items():
            resolved["after"][name] = (what, resolve(args.python, ROOT, extra, more,
                                                     constraints if pinned_torch else no_torch_pins))
        old = tmp / "before"
        old.mkdir()
        archive = subprocess.run(["git", "archive", args.before, "pyproject.toml", "README.md", "clusterfed"],
                                 cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        for name, extra in BEFORE.items():
            resolved["before"][name] = (f"clusterfed{extra} at {args.before}", resolve(args.python, old, extra, [], constraints))
        wheel_dir = tmp / "wheel"
        subprocess.run([args.python, "-m", "pip", "wheel", "-q", "--no-deps", str(ROOT), "-w", str(wheel_dir)],
                       check=True, capture_output=True)
        wheel = str(next(wheel_dir.glob("clusterfed-*.whl")))
        results["real_installs"] = {
            "server": real_install(args.python, [[wheel]], tmp, "server"),
            "beside_flower_1_42": real_install(args.python, [["flwr==1.42.0"], [wheel]], tmp, "beside"),
        }
    sizes = installed_sizes(folders)  # read last: the venvs named may still be filling when this starts
    for when, installs in resolved.items():
        for name, (what, distributions) in installs.items():
            results[when][name] = {"what": what, **measure(distributions, sizes)}
    check = results["real_installs"]["beside_flower_1_42"]
    results["flower_1_42_kept_and_no_torch"] = check["flwr"] == "1.42.0" and check["torch"] is None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sizes.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "sizes.md").write_text(table(results))
    write_manifest(out, manifest, method=__doc__.split("\n\n", 2)[2].strip())
    print(table(results))


def table(results: dict) -> str:
    gb = lambda b: f"{b / 1e9:.2f} GB" if b >= 1e9 else f"{b / 1e6:.0f} MB"  # noqa: E731
    lines = ["| install | before | after | torch | largest parts (after, MB) |", "|---|---|---|---|---|"]
    for name, after in results["after"].items():
        before = results["before"].get(name)
        parts = ", ".join(f"{n} {mb:g}" for n, mb in list(after["largest_mb"].items())[:4])
        lines.append(f"| {name}: {after['what']} | {gb(before['bytes']) if before else '-'} | {gb(after['bytes'])} | "
                     f"{after['versions'].get('torch', 'none')} | {parts} |")
    real = results["real_installs"]
    lines += ["", f"Real install of `pip install clusterfed` into an empty venv: {gb(real['server']['site_packages_bytes'])} "
              f"(du of site-packages; flwr {real['server']['flwr']}, torch {real['server']['torch']}).",
              f"Into a venv holding flwr==1.42.0: flwr {real['beside_flower_1_42']['flwr']} afterwards, "
              f"torch {real['beside_flower_1_42']['torch']}."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
