"""Short runs of every strategy give the per-client accuracies, bytes and clusterings
recorded in tests/golden/runs.json (made by tests/golden/make_golden.py before the round
runner was split from the algorithms): a refactor must not change a number."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "golden"))
from make_golden import RUNS, canonical_assignment, run_one  # noqa: E402
pytestmark = pytest.mark.end_to_end

GOLDEN = json.loads((Path(__file__).parent / "golden" / "runs.json").read_text())


@pytest.mark.parametrize("name", list(RUNS))
def test_numbers_unchanged(name, tmp_path):
    got, want = run_one(name, tmp_path / name), GOLDEN[name]
    assert len(got["rounds"]) == len(want["rounds"])
    for round_got, round_want in zip(got["rounds"], want["rounds"]):
        assert round_got == round_want, f"{name} round differs"
    assert canonical_assignment(got["assignment"]) == canonical_assignment(want["assignment"])


# checkpoints written by an earlier version (tests/golden/make_checkpoints.py): the state's
# layout is part of the contract, so a refactor must resume them into the same last round
from make_checkpoints import CHECKPOINTED, resume  # noqa: E402

CHECKPOINTS = Path(__file__).parent / "golden" / "checkpoints"
RESUMED = json.loads((CHECKPOINTS / "resumed.json").read_text())


@pytest.mark.parametrize("name", CHECKPOINTED)
def test_old_checkpoints_resume_into_the_same_round(name, tmp_path):
    got, want = resume(name, CHECKPOINTS / name, tmp_path / name), RESUMED[name]
    assert got["round"] == want["round"], f"{name}: the resumed round differs"
    assert canonical_assignment(got["assignment"]) == canonical_assignment(want["assignment"])
    # resuming is the uninterrupted run; checkpoints made before the clustering upload was
    # projected carry no projection plan, so their newcomers upload the chosen layer whole
    whole = {"bytes_up"} if name in PREDATE_PROJECTION else set()
    golden = GOLDEN[name]["rounds"][-1]
    assert {k: v for k, v in want["round"].items() if k not in whole} == {k: v for k, v in golden.items() if k not in whole}
    if whole:
        assert want["round"]["bytes_up"] > golden["bytes_up"]


PREDATE_PROJECTION = ("fedclust", "adacfl")
