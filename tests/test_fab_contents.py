"""The app bundle holds every module of the package: Flower's FAB build leaves out files named
like tests (``*_test.py``, ``test_*.py``) whatever ``fab-include`` says, and a deployed
ServerApp then fails to import the module that was left out."""

from __future__ import annotations

from pathlib import Path

import pathspec
from flwr.common.constant import FAB_EXCLUDE_PATTERNS

ROOT = Path(__file__).resolve().parents[1]


def test_no_module_of_the_package_is_left_out_of_the_app_bundle():
    modules = [p.relative_to(ROOT).as_posix() for p in (ROOT / "clusterfed").rglob("*.py")]
    excluded = pathspec.PathSpec.from_lines("gitwildmatch", FAB_EXCLUDE_PATTERNS)
    left_out = sorted(m for m in modules if excluded.match_file(m))
    assert modules and not left_out, f"Flower's FAB build leaves these out (rename them): {left_out}"
