"""The two test tiers cannot drop a test: ``make test`` runs every test, ``make test-fast`` leaves
out only those marked ``end_to_end``, and that marker is registered (so a test marked with it is
known to pytest, and a misspelt marker is not mistaken for it)."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILTIN_MARKERS = {"parametrize", "skip", "skipif", "xfail", "usefixtures", "filterwarnings", "timeout"}


def recipe(target: str) -> list[str]:
    """The command lines of one Makefile target."""
    lines = (ROOT / "Makefile").read_text().split("\n")
    start = next(i for i, line in enumerate(lines) if re.match(rf"{re.escape(target)}\s*:(?!=)", line))
    body = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        body.append(line.strip())
    return body


def pytest_options() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]


def registered_markers() -> set[str]:
    return {line.split(":")[0].strip() for line in pytest_options().get("markers", [])}


def test_the_end_to_end_marker_is_registered():
    assert "end_to_end" in registered_markers()


def test_make_test_runs_every_test_and_test_fast_only_leaves_out_end_to_end():
    test = [line for line in recipe("test") if "pytest" in line]
    # make test spreads the files over pytest-xdist processes; that option selects nothing
    assert test == ["$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile tests"], \
        f"make test must run every test as it is: {test}"
    fast = [line for line in recipe("test-fast") if "pytest" in line]
    assert fast == ['$(PY) -m pytest -m "not end_to_end" tests'], fast
    # nothing global deselects: a -m, -k, --deselect or --ignore in addopts would apply to make test too
    addopts = pytest_options().get("addopts", "")
    assert not re.search(r"(?:^|\s)(?:-m|-k|--deselect|--ignore)", addopts), addopts


def test_every_marker_the_tests_use_is_registered_or_pytest_s_own():
    used = set()
    for path in (ROOT / "tests").glob("*.py"):
        used |= set(re.findall(r"pytest\.mark\.(\w+)", path.read_text()))
    unknown = used - registered_markers() - BUILTIN_MARKERS
    assert not unknown, f"markers used in tests/ but not registered in pyproject.toml: {sorted(unknown)}"
