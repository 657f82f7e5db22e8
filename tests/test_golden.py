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
    got, want = resume(name, CHECKPOINTS / name, tmp_path / name, **PREDATE_EVIDENCE.get(name, {}),
                       **PREDATE_SAMPLING.get(name, {})), RESUMED[name]
    assert got["round"] == want["round"], f"{name}: the resumed round differs"
    assert canonical_assignment(got["assignment"]) == canonical_assignment(want["assignment"])
    if name in PREDATE_EVIDENCE and not set(PREDATE_EVIDENCE[name]) <= set(RUNS[name]):
        return  # its golden run now splits on evidence; the checkpoint goes on as it was running
    # resuming is the uninterrupted run; checkpoints made before the clustering upload was
    # projected carry no projection plan, so their newcomers upload the chosen layer whole
    whole = {"bytes_up"} if name in PREDATE_PROJECTION else set()
    golden = GOLDEN[name]["rounds"][-1]
    assert {k: v for k, v in want["round"].items() if k not in whole} == {k: v for k, v in golden.items() if k not in whole}
    if whole:
        assert want["round"]["bytes_up"] > golden["bytes_up"]


PREDATE_PROJECTION = ("fedclust", "adacfl")
# checkpoints of the CFL family written before split-timing existed ran on Sattler's criteria:
# they resume on them (a checkpoint without the key is refused at the new default, evidence)
PREDATE_EVIDENCE = {"cfl-merge": {"split-timing": "criteria", "ask-again": False, "decision-arrays": "every",
                                  "same-round-splits": False, "split-min-repliers": 0},
                    "hicfl": {"split-timing": "criteria", "ask-again": False, "decision-arrays": "every",
                              "same-round-splits": False, "split-min-repliers": 0}}
# checkpoints written before the clustering step asked every active client resume asking the
# sample, and before the revisits pooled rounds cutting one round's repliers (the golden runs
# are at full participation, where both ask everyone and nothing is pooled)
PREDATE_SAMPLING = {"fedclust": {"cluster-all-active": False, "revisit-rounds": 1},
                    "adacfl": {"cluster-all-active": False, "revisit-rounds": 1}}


def test_a_checkpoint_older_than_split_timing_is_refused_at_the_new_default_with_the_value_that_resumes_it(tmp_path):
    from clusterfed.strategy_config import ConfigError

    with pytest.raises(ConfigError, match=r"cfl.split-timing \('evidence' now; the checkpoint predates the key "
                                              r"and ran as 'criteria': set cfl.split-timing = 'criteria' to resume it\)"):
        resume("cfl-merge", CHECKPOINTS / "cfl-merge", tmp_path / "cfl-merge")
