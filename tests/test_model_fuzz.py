"""The random-model harness (benchmarks/model_fuzz.py, benchmarks/fuzz/): draws reproduce, every
family builds and runs, freezing and head placement do what the cell says, the held-out seeds
are refused, the verdict on hand-made numbers, and one tiny cell end to end."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "benchmarks") not in sys.path:
    sys.path.append(str(ROOT / "benchmarks"))  # after tests/: tests/model_matrix is the package

import model_fuzz  # noqa: E402
from fuzz.apps import train  # noqa: E402
from fuzz.cell import FAMILIES, HEAD_POSITIONS, Cell, draw_cell  # noqa: E402
from fuzz.data import client_arrays, loaders, true_groups, world  # noqa: E402
from fuzz.models import build_model, freeze_leading  # noqa: E402
from fuzz.run import ari, decision_text, placed_clients, verdict  # noqa: E402

BASE = Cell(seed=5, family="mlp", width=16, depth=2, activation="relu", dropout=0.0, norm="none", recurrent="",
            frozen_fraction=0.0, head_position="last", extra_heads=0, optimizer="sgd", lr=0.1, local_epochs=1,
            batch_size=16, dataset="digits", shift="label_swap", groups=2, clients=6, participation=1.0,
            train_examples=32, test_examples=16)


def variants() -> list[Cell]:
    """Every family (ResNet with each norm, both recurrent cells) with each head position."""
    cells = []
    for family in FAMILIES:
        extras = {"resnet": [{"norm": n} for n in ("batch", "group", "none")],
                  "recurrent": [{"recurrent": r} for r in ("gru", "lstm")],
                  "multihead": [{"extra_heads": 2}]}.get(family, [{}])
        for extra in extras:
            for position in HEAD_POSITIONS:
                cells.append(replace(BASE, family=family, head_position=position, depth=2, width=16, **extra))
    return cells


def test_same_seed_same_cell_and_json_round_trip():
    for seed in (0, 1, 17, 999):
        cell = draw_cell(seed)
        assert cell == draw_cell(seed)
        assert Cell.from_json(cell.to_json()) == cell
        assert json.loads(cell.to_json())["seed"] == seed
    assert len({draw_cell(seed).to_json() for seed in range(20)}) == 20


def test_draws_stay_in_their_ranges():
    for seed in range(200):
        cell = draw_cell(seed)
        assert 6 <= cell.clients <= 40 and cell.participation in (0.5, 1.0)
        assert cell.groups == 1 if cell.shift == "iid" else 2 <= cell.groups <= 5
        assert cell.clients >= 2 * cell.groups
        assert (cell.family == "multihead") <= (cell.extra_heads >= 1)
    assert {draw_cell(seed).family for seed in range(200)} == set(FAMILIES)
    assert {draw_cell(seed).shift for seed in range(200)} == {"label_swap", "rotation", "label_skew", "iid"}


@pytest.mark.parametrize("dataset", ["digits", "mnist"])
def test_every_family_builds_and_runs_forward_and_backward(dataset):
    if dataset == "mnist":
        try:
            from fuzz.data import mnist_root

            mnist_root()
        except FileNotFoundError:
            pytest.skip("MNIST files not here")
    for cell in variants():
        cell = replace(cell, dataset=dataset)
        model = build_model(cell)
        x, y = next(iter(loaders(cell, 0)[0]))
        model.train()
        logits = model(x)
        assert logits.shape == (len(y), 10), cell.label()
        loss = torch.nn.functional.cross_entropy(logits, y) + model.extra_loss(y)
        loss.backward()
        assert torch.isfinite(loss)
        model.load_state_dict(build_model(cell).state_dict())  # a fresh build has the same arrays


def test_frozen_fraction_really_freezes():
    for family in ("mlp", "cnn", "resnet", "attention", "recurrent"):
        cell = replace(BASE, family=family, frozen_fraction=0.5, norm="group" if family == "resnet" else "none",
                       recurrent="gru" if family == "recurrent" else "", optimizer="adam", lr=0.01)
        model = build_model(cell)
        frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
        assert frozen and all(n.startswith("trunk.") for n in frozen), family
        trunk_total = sum(p.numel() for n, p in model.named_parameters() if n.startswith("trunk."))
        assert sum(p.numel() for n, p in model.named_parameters() if n in frozen) < trunk_total
        before = {k: v.clone() for k, v in model.state_dict().items()}
        train(cell, model, loaders(cell, 0)[0], 1, cell.lr)
        after = model.state_dict()
        for name in frozen:
            assert torch.equal(before[name], after[name]), name
        assert not torch.equal(before["head.weight"], after["head.weight"])
    assert freeze_leading(torch.nn.Linear(2, 2), 0.0) == []


def test_head_sits_where_the_cell_says():
    for cell in variants():
        keys = list(build_model(cell).state_dict())
        head = [i for i, k in enumerate(keys) if k.startswith("head.")]
        assert head, cell.label()
        if cell.head_position == "first":
            assert head == [0, 1], cell.label()
        elif cell.head_position == "last":
            assert head == [len(keys) - 2, len(keys) - 1], cell.label()
        else:
            assert head[-1] < len(keys) - 1 and head[0] > 0, cell.label()
            assert not any(k.startswith(("head.", "trunk.")) for k in keys[head[-1] + 1:]), cell.label()


def test_groups_and_shifts():
    cell = replace(BASE, clients=10, groups=3, shift="label_skew")
    groups = true_groups(cell)
    assert sorted(groups) == sorted(i % 3 for i in range(10))
    shares = world(cell)["shares"]
    for partition in range(cell.clients):
        _, y, _, yt = client_arrays(cell.to_json(), partition)
        assert set(y) | set(yt) <= set(shares[groups[partition]].tolist())
    assert set(true_groups(replace(BASE, shift="iid", groups=1))) == {0}
    swap = replace(BASE, shift="label_swap", groups=2)
    permutation = world(swap)["permutations"][1]
    assert sorted(permutation) == list(range(10))


def test_seeds_parse_and_held_out_refused():
    assert model_fuzz.parse_seeds("0-3,7,2") == [0, 1, 2, 3, 7]
    assert model_fuzz.seeds_text([0, 1, 2, 4, 5, 9]) == "0-2,4-5,9"
    assert model_fuzz.parse_seeds(model_fuzz.seeds_text([3, 4, 8])) == [3, 4, 8]
    model_fuzz.check_held_out([0, 999], held_out=False)
    with pytest.raises(SystemExit, match="held-out"):
        model_fuzz.check_held_out([998, 1000], held_out=False)
    with pytest.raises(SystemExit, match="held-out"):
        model_fuzz.main(["--seeds", "1000-1059", "--out", "unused"])
    with pytest.raises(SystemExit):
        model_fuzz.check_held_out([5, 1001], held_out=True)
    model_fuzz.check_held_out([1000, 1059], held_out=True)


def test_verdict_on_hand_made_numbers():
    row = {"accuracy": 0.80, "ari": 0.95, "clusters": 3, "last_decision": "", "error": None}
    out = verdict(row, 0.70, iid=False)
    assert out["recovered"] and out["passes"] and out["loss_pp"] == -10.0 and out["within_1pp"]
    # recovers nothing, but FedAvg is at its ceiling and 0.5 pp are lost: passes
    out = verdict({**row, "accuracy": 0.955, "ari": 0.0}, 0.96, iid=False)
    assert not out["recovered"] and out["at_ceiling"] and out["passes"] and out["loss_pp"] == 0.5
    # at the ceiling but 2 pp lost: a miss, with no words in its last line
    out = verdict({**row, "accuracy": 0.94, "ari": 0.5}, 0.96, iid=False)
    assert not out["passes"] and out["loss_pp"] == 2.0 and not out["within_1pp"] and out["reason_named"] is False
    out = verdict({**row, "accuracy": 0.94, "ari": 0.5, "last_decision": "CFL ends with one cluster: ..."}, 0.96,
                  iid=False)
    assert out["reason_named"] is True
    # IID control: one cluster is right, two is a miss whatever the ARI says
    assert verdict({**row, "clusters": 1, "ari": 1.0}, 0.7, iid=True)["one_cluster"] is True
    out = verdict({**row, "clusters": 2, "ari": 0.0}, 0.7, iid=True)
    assert out["one_cluster"] is False and not out["passes"]
    # a run that stopped: no accuracy, a miss that names its error
    out = verdict({"accuracy": None, "ari": None, "clusters": None, "last_decision": "", "error": "CapabilityError: x"},
                  0.7, iid=False)
    assert not out["passes"] and out["loss_pp"] is None and out["reason_named"] is True


def test_a_client_never_placed_is_no_cluster():
    """result.assignment names a client the run never placed as UNASSIGNED (-1): the IID control
    with one cluster and one unplaced client has one cluster, and the ARI counts placed clients."""
    cell = replace(BASE, shift="iid", groups=1, clients=4)
    assignment = {"node-1000": 3, "node-1001": 3, "node-1002": -1, "node-1003": 3}
    assert placed_clients(assignment) == {"node-1000": 3, "node-1001": 3, "node-1003": 3}
    assert ari(cell, assignment) == 1.0
    grouped = replace(BASE, groups=2, clients=4)
    found = {f"node-{1000 + i}": group for i, group in enumerate(true_groups(grouped))}
    found["node-1003"] = -1  # never placed: not a third cluster
    assert ari(grouped, found) == 1.0


def test_decision_text_keeps_only_the_strategys_words():
    line = ("[ROUND 10/10] train: 9 of 9 replies accepted; 2 clusters; train loss 0.5; evaluate over 9 of 9 "
            "clients: eval_acc 0.9; FedClust ends with 2 clusters: lambda auto 0.9")
    assert decision_text(line) == "FedClust ends with 2 clusters: lambda auto 0.9"
    assert decision_text("[ROUND 3/3] train: 6 of 6 replies accepted; 1 cluster; train loss 2.3") == ""
    assert decision_text(None) == ""


def test_groups_help_only_when_the_oracle_beats_fedavg():
    from fuzz.run import groups_help

    assert groups_help(0.50, 0.60, iid=False) is True
    assert groups_help(0.50, 0.505, iid=False) is False  # half a point: finding the groups pays nothing here
    assert groups_help(0.10, 0.09, iid=False) is False
    assert groups_help(0.50, None, iid=False) is None  # no oracle row
    assert groups_help(0.50, 0.50, iid=True) is True  # an IID control's one cluster is a decision


def test_a_tiny_cell_end_to_end(tmp_path):
    from fuzz.report import informative_cell, load_records, write_tables
    from fuzz.run import run_cell

    torch.set_num_threads(1)
    cell = replace(BASE, seed=3, clients=6, groups=2, shift="label_swap")
    record = run_cell(cell, ["fedavg", "fedclust", "ifca"], rounds=2, out=tmp_path)
    rows = {r["strategy"]: r for r in record["rows"]}
    assert list(rows) == ["fedavg", "fedclust", "ifca"]
    assert rows["fedavg"]["client"] == "stock" and rows["ifca"]["client"] == "helper"
    for row in rows.values():
        assert row["error"] is None, row["error"]
        assert 0.0 <= row["accuracy"] <= 1.0 and row["clusters"] >= 1 and row["bytes_up"] > 0
        assert row["fedavg_accuracy"] == rows["fedavg"]["accuracy"] and row["last_line"].startswith("[ROUND 2/2]")
    assert rows["fedavg"]["clusters"] == 1 and rows["fedavg"]["loss_pp"] == 0.0
    assert record["groups_help"] is None and informative_cell(record) is None  # no oracle row yet
    assert (tmp_path / "cells" / "3.json").exists()
    assert model_fuzz.finished(tmp_path, 3, 2, ["fedavg", "fedclust", "ifca"])
    assert not model_fuzz.finished(tmp_path, 3, 5, ["fedavg", "fedclust", "ifca"])
    assert not model_fuzz.finished(tmp_path, 3, 2, ["fedavg", "oracle"])
    table = write_tables(tmp_path, load_records(tmp_path))
    assert [row["strategy"] for row in table] == ["fedavg", "fedclust", "ifca"]
    assert table[0]["informative_cells"] is None
    assert (tmp_path / "summary.csv").read_text().startswith("strategy,cells,pass_share")

    # the oracle added to the folder: the earlier rows are kept as they were, only the oracle runs
    earlier = model_fuzz.earlier_record(tmp_path, 3, 2)
    added = run_cell(cell, ["fedavg", "oracle"], rounds=2, out=tmp_path, earlier=earlier)
    again = {r["strategy"]: r for r in added["rows"]}
    assert list(again) == ["fedavg", "fedclust", "ifca", "oracle"]  # every earlier row kept, not only those named
    assert again["fedclust"]["seconds"] == rows["fedclust"]["seconds"]
    assert again["oracle"]["client"] == "helper"  # it reads the true groups, which stock clients do not report
    assert again["oracle"]["clusters"] == 2 and again["oracle"]["ari"] == 1.0
    assert again["ifca"]["oracle_accuracy"] == again["oracle"]["accuracy"]
    helps = 100 * (again["oracle"]["accuracy"] - again["fedavg"]["accuracy"]) > 1.0
    assert added["groups_help"] is helps and informative_cell(added) is helps
    assert model_fuzz.finished(tmp_path, 3, 2, ["fedavg", "oracle"])
    table = {row["strategy"]: row for row in write_tables(tmp_path, load_records(tmp_path))}
    assert table["fedclust"]["informative_cells"] == (1 if helps else 0)


def test_a_run_judged_at_an_earlier_round_is_what_a_run_of_that_many_rounds_ends_with(tmp_path):
    """``judge_at``: the clusters and accuracy after round 2 of a 3-round run are those a 2-round
    run ends with (no strategy reads how many rounds are left; the clients' draws are the
    same), judged against FedAvg's round 2; the folder's report gets that round's table."""
    from fuzz.report import at_round, judged_rounds, load_records
    from fuzz.run import run_cell

    torch.set_num_threads(1)
    cell = replace(BASE, seed=3, clients=6, groups=2, shift="label_swap")
    names = ["fedavg", "oracle", "fedclust", "cfl"]
    ended = run_cell(cell, names, rounds=2)
    short = {r["strategy"]: r for r in ended["rows"]}
    record = run_cell(cell, names, rounds=3, out=tmp_path, judge_at=(2, 3, 7))
    assert set(record["groups_help_at_round"]) == {"2"}  # only rounds before the last are judged
    for row in record["rows"]:
        then, two_rounds = row["at_round"]["2"], short[row["strategy"]]
        for key in ("accuracy", "ari", "clusters", "placed", "passes", "loss_pp", "fedavg_accuracy"):
            assert then[key] == two_rounds[key], (row["strategy"], key)
        assert then["last_line"].startswith("[ROUND 2/3]")
    assert record["groups_help_at_round"]["2"] is ended["groups_help"]
    records = load_records(tmp_path)
    assert judged_rounds(records) == ["2"]
    view = at_round(records, "2")
    assert view[0]["rounds"] == 2 and view[0]["rows"][2]["accuracy"] == short["fedclust"]["accuracy"]
    model_fuzz.report(tmp_path, {"git": {"commit": "x"}})
    assert (tmp_path / "summary-round-2.md").exists() and (tmp_path / "cells-round-2.md").exists()
    text = (tmp_path / "README.md").read_text()
    assert "## Per strategy after round 2 of the same runs" in text and "--rounds 3 --judge-at 2 --out" in text
    for bad in ("3", "ten"):
        with pytest.raises(SystemExit, match=f"--judge-at {bad}: rounds from 1 to 2"):
            model_fuzz.main(["--seeds", "3", "--rounds", "3", "--judge-at", bad, "--out", str(tmp_path / "no")])
    assert not (tmp_path / "no").exists()  # refused before any work


def test_group_signal_scores_the_true_groups_in_each_array_and_all_together():
    """Groups that differ in one array score high there and in the whole; an array where they
    are drawn from one population scores near 0; an IID control (one group) is not scored."""
    from fuzz.signal import ALL, group_silhouettes

    rng = __import__("numpy").random.default_rng(0)
    groups = [0, 1] * 8
    directions = rng.standard_normal((2, 50))
    updates = [{"head": directions[g] + 0.1 * rng.standard_normal(50), "trunk": rng.standard_normal(400)}
               for g in groups]
    scores = group_silhouettes(updates, groups)
    assert scores["head"] > 0.8 and abs(scores["trunk"]) < 0.05
    assert 0 < scores[ALL] < scores["head"]
    assert group_silhouettes(updates, [0] * 16) == {}
    frozen = [{**u, "trunk": 0 * u["trunk"]} for u in updates]
    assert group_silhouettes(frozen, groups)["trunk"] == 0.0


def test_the_chance_level_of_the_best_silhouette_is_high_for_few_clients_and_small_arrays():
    """Shuffled labels on 6 clients' 2-number arrays reach silhouettes a real signal would: the
    chance level of the best over many such arrays is high, and far lower on 40 clients' wide arrays."""
    import numpy as np
    from fuzz.signal import chance_best, distance_matrices

    rng = np.random.default_rng(1)
    few = distance_matrices([{f"b{i}": rng.standard_normal(2) for i in range(20)} for _ in range(6)])
    many = distance_matrices([{f"w{i}": rng.standard_normal(500) for i in range(20)} for _ in range(40)])
    assert chance_best([few], [0, 0, 1, 1, 2, 2]) > 0.3
    assert chance_best([many], [i % 2 for i in range(40)]) < 0.05


def test_the_table_counts_the_cells_whose_groups_show_in_the_updates_from_a_signal_file():
    """With a group_signal record per cell the table gives the pass share over the cells whose
    groups show (best silhouette >= 0.2 and above chance) and the IID controls; without one it
    cannot ("-", None)."""
    from fuzz.report import markdown, summarise, visible_cell

    def record(seed, shift, passes):
        row = {"strategy": "fedclust", "passes": passes, "loss_pp": 0.0, "clusters": 1 if shift == "iid" else 2,
               "reason_named": True, "ari": 1.0, "error": None, "peak_trainings": 1, "bytes_up": 1, "seconds": 1.0,
               "accuracy": 0.5}
        return {"cell": {"seed": seed, "shift": shift}, "rows": [row]}

    records = [record(1, "rotation", False), record(2, "label_swap", True), record(3, "iid", True),
               record(4, "label_skew", False)]
    signal = {"1": {"best": 0.1, "chance": 0.0}, "2": {"best": 0.6, "chance": 0.1},
              "4": {"best": 0.45, "chance": 0.5}}  # 4: no higher than chance
    assert [visible_cell(r, signal) for r in records] == [False, True, True, False]
    (row,) = summarise(records, signal)
    assert (row["visible_passes"], row["visible_cells"], row["passes"]) == (2, 2, 2)
    assert "| 2 of 2 (1.00) |" in markdown([row])
    (blind,) = summarise(records)
    assert blind["visible_cells"] is None and visible_cell(records[0], None) is None


def test_a_shuffle_that_gives_the_true_groups_back_is_not_counted_as_chance():
    """6 clients in 3 pairs have 15 partitions: about 1 shuffle in 15 is the truth itself, whose
    silhouette is the real signal's. Left in, the chance level of a clean signal would be the
    signal; it must stay below it."""
    import numpy as np
    from fuzz.signal import chance_best, distance_matrices, group_silhouettes

    rng = np.random.default_rng(0)
    groups = [0, 0, 1, 1, 2, 2]
    directions = rng.standard_normal((3, 30))
    updates = [{"head": directions[g] + 0.01 * rng.standard_normal(30)} for g in groups]
    best = group_silhouettes(updates, groups)["head"]
    assert chance_best([distance_matrices(updates)], groups, draws=300) < best - 0.1


def test_a_bad_signal_or_judged_folder_is_refused_before_any_cell_runs(tmp_path):
    """``--signal`` must name a group_signal.py record in the repository, and ``--judged`` fuzz
    folders: each is refused with one line before any cell is drawn, and the output folder's
    manifest is left as it was."""
    import group_signal

    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text('{"kept": true}')
    broken = ROOT / "benchmarks" / "results" / "model-fuzz" / "manifest.json"  # JSON, not a signal record
    for signal, said in ((tmp_path / "none.json", "no such file"), (out / "manifest.json", "outside this repository"),
                         (broken, "not a group_signal.py record")):
        with pytest.raises(SystemExit, match=said):
            model_fuzz.main(["--seeds", "0", "--out", str(out), "--signal", str(signal), "--report-only"])
    assert json.loads((out / "manifest.json").read_text()) == {"kept": True}
    with pytest.raises(SystemExit, match="no cells/ folder"):
        group_signal.main(["--seeds", "0", "--out", str(tmp_path / "signal"), "--judged", str(tmp_path)])
    assert not (tmp_path / "signal").exists()


def test_rewriting_the_signal_report_keeps_the_record_of_the_run_that_computed_it(tmp_path, monkeypatch):
    """A group_signal.py run that computes no cell (every seed already in signal.json) rewrites the
    README and figure only: the manifest still names the commit, command and time of the run that
    computed the numbers, and gains a ``report`` entry; the README names both commits."""
    import fuzz.signal
    import group_signal

    fake = {"rounds": {"1": {"head.weight": 0.5, "all arrays": 0.4}}, "best": 0.5, "best_round": 1,
            "best_array": "head.weight", "chance": 0.1, "all_arrays": {"1": 0.4}}
    monkeypatch.setattr(fuzz.signal, "cell_signal", lambda cell: dict(fake))
    out = tmp_path / "signal"
    seed = next(s for s in range(50) if draw_cell(s).shift != "iid")
    group_signal.main(["--seeds", str(seed), "--out", str(out)])
    computed = json.loads((out / "manifest.json").read_text())
    computed.update(git={"commit": "a" * 40, "dirty": False}, wall_seconds=123.0)
    (out / "manifest.json").write_text(json.dumps(computed))
    monkeypatch.setattr(fuzz.signal, "cell_signal", lambda cell: pytest.fail("a cell was computed again"))
    group_signal.main(["--seeds", str(seed), "--out", str(out)])
    kept = json.loads((out / "manifest.json").read_text())
    assert kept["git"]["commit"] == "a" * 40 and kept["wall_seconds"] == 123.0
    assert kept["started"] == computed["started"] and kept["report"]["command"][0] == "benchmarks/group_signal.py"
    assert f"computed at commit `{'a' * 40}`" in (out / "README.md").read_text()
    assert "rewritten from it at" in (out / "README.md").read_text()
    later = next(s for s in range(seed + 1, 99) if draw_cell(s).shift != "iid")
    monkeypatch.setattr(fuzz.signal, "cell_signal", lambda cell: dict(fake))
    group_signal.main(["--seeds", f"{seed},{later}", "--out", str(out)])  # one cell added
    grown = json.loads((out / "manifest.json").read_text())
    assert grown["earlier_runs"][0]["git"]["commit"] == "a" * 40 and grown["git"]["commit"] != "a" * 40
    assert f"its earlier cells at `{'a' * 40}`" in (out / "README.md").read_text()


def test_the_readme_says_how_to_run_the_folder_again_with_its_own_strategies_and_held_out(tmp_path):
    """Held-out seeds are refused without ``--held-out``, so the command a held-out folder's README
    gives carries it (and a development folder's does not); it names the folder's strategies and
    rounds, since without them a rerun would add every strategy the folder lacks."""
    def record(seed, rounds=10):
        return {"cell": {"seed": seed}, "rounds": rounds, "seconds": 1.0,
                "rows": [{"strategy": "fedavg"}, {"strategy": "cfl"}]}

    held = model_fuzz.readme(tmp_path, [record(1000), record(1001)], "", {})
    assert "model_fuzz.py --held-out --seeds 1000-1001 --strategies fedavg,cfl --out" in held
    development = model_fuzz.readme(tmp_path, [record(3, rounds=4)], "", {})
    assert "--held-out" not in development and "--strategies fedavg,cfl --rounds 4 --out" in development


def test_each_miss_is_sorted_into_the_first_kind_that_applies_and_only_a_one_cluster_end_is_excused(tmp_path):
    """fuzz_misses.py: a failed run, an IID control split; one cluster at FedAvg's accuracy where
    the oracle gains 1 point or less, where the groups show in no array (signal), where FedAvg
    stayed below 0.2; the rest by cluster count, a wrong split in a cell of those kinds included.
    The last shares leave out the excused misses only, and the passes in such cells are counted."""
    import fuzz_misses

    def record(seed, shift, groups, fedavg, oracle, clusters, passes, loss=0.0, error=None):
        rows = [{"strategy": "fedavg", "accuracy": fedavg, "clusters": 1, "passes": False},
                {"strategy": "oracle", "accuracy": oracle, "clusters": groups, "passes": True},
                {"strategy": "fedclust", "accuracy": fedavg, "clusters": clusters, "passes": passes,
                 "loss_pp": loss, "error": error}]
        return {"cell": {"seed": seed, "shift": shift}, "true_groups": list(range(groups)) * 3, "rows": rows}

    records = [record(0, "label_swap", 3, 0.40, 0.60, None, False, error="ValueError: bad"),
               record(1, "iid", 1, 0.5, 0.5, 2, False),             # an IID control split
               record(2, "rotation", 3, 0.30, 0.305, 1, False),     # the oracle gains half a point
               record(3, "rotation", 3, 0.30, 0.50, 1, False),      # no trace (signal below)
               record(4, "label_swap", 3, 0.15, 0.40, 1, False),    # FedAvg did not learn
               record(5, "label_swap", 3, 0.40, 0.60, 2, False),    # too few
               record(6, "label_swap", 3, 0.40, 0.60, 4, False),    # too many
               record(7, "label_swap", 3, 0.40, 0.60, 3, False),    # three clusters, not the groups
               record(8, "rotation", 3, 0.30, 0.305, 2, False),     # a wrong split where the groups do not pay
               record(9, "rotation", 3, 0.30, 0.305, 1, False, loss=2.0),  # one cluster, 2 points below FedAvg
               record(10, "rotation", 3, 0.30, 0.50, 3, True),      # passes where no trace shows
               record(11, "label_skew", 3, 0.10, 0.90, 3, True)]
    signal = {"3": {"best": 0.1, "chance": 0.0}, "10": {"best": 0.1, "chance": 0.0}, "5": {"best": 0.5, "chance": 0.0}}
    kinds = [fuzz_misses.miss_kind(r, r["rows"][2], signal) for r in records[:8]]
    assert kinds == list(fuzz_misses.KINDS)
    assert [fuzz_misses.miss_kind(r, r["rows"][2], signal) for r in records[8:10]] == ["too_few_clusters"] * 2
    (row,) = fuzz_misses.tally(records, signal)
    assert row["passes"] == 2 and sum(row["misses"].values()) == 10 and row["passes_in_excused_cells"] == 1
    assert (row["judged_cells"], row["judged_learnt_cells"]) == (10, 9)  # 12 less cells 2, 3; then 4
    assert row["missed_cells"]["too_few_clusters"] == [5, 8, 9]
    assert "| fedclust | 12 | 2 (17%) | 1 | 1 | 1 | 1 | 1 | 1 | 3 | 1 | 1 | 2 of 10 (20%) | 2 of 9 (22%) |" in \
        fuzz_misses.markdown([row])

    with pytest.raises(SystemExit, match="no cells"):
        fuzz_misses.main(["--folders", str(tmp_path), "--out", str(tmp_path / "out")])
    folder = ROOT / "benchmarks" / "results" / "model-fuzz" / "held-out-1270-1299"
    (tmp_path / "signal.json").write_text("{}")
    with pytest.raises(SystemExit, match="outside this repository"):  # checked as model_fuzz --signal is
        fuzz_misses.main(["--folders", str(folder), "--signal", str(tmp_path), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_passes_are_broken_down_by_cell_trait_and_by_folder(tmp_path):
    """fuzz_misses.py: the pass share per value of each cell trait counts each strategy's own rows
    (a strategy missing from a folder is not counted there), and the folder table gives each
    strategy's passes and the folder's commit; a cell counts for them together when any passes."""
    import fuzz_misses

    def record(seed, shift, family, participation, fedavg, passed, folder, with_cfl=True):
        rows = [{"strategy": "fedavg", "accuracy": fedavg, "clusters": 1, "passes": False},
                {"strategy": "fedclust", "accuracy": fedavg, "clusters": 2, "passes": passed}]
        if with_cfl:
            rows.append({"strategy": "cfl", "accuracy": fedavg, "clusters": 1, "passes": not passed})
        cell = {"seed": seed, "shift": shift, "family": family, "participation": participation, "dataset": "digits"}
        return {"cell": cell, "true_groups": [0, 1], "rows": rows, "folder": folder}

    records = [record(1, "rotation", "mlp", 0.5, 0.5, True, "a"),
               record(2, "rotation", "cnn", 1.0, 0.1, False, "a"),
               record(3, "label_swap", "mlp", 0.5, 0.5, True, "b", with_cfl=False)]
    where = {(w["trait"], w["value"]): w for w in fuzz_misses.where_they_miss(records)}
    assert where[("shift", "rotation")]["cells"] == 2
    assert where[("shift", "rotation")]["strategies"] == {"fedclust": {"cells": 2, "passes": 1},
                                                          "cfl": {"cells": 2, "passes": 1}}
    assert where[("shift", "label_swap")]["strategies"] == {"fedclust": {"cells": 1, "passes": 1}}
    assert where[("participation", "half the clients")]["strategies"]["fedclust"] == {"cells": 2, "passes": 2}
    assert where[("FedAvg learnt", "no (< 0.2)")]["strategies"]["cfl"] == {"cells": 1, "passes": 1}
    records[2]["rows"] = records[2]["rows"][1:]  # a cell without FedAvg's row is said so, not counted unlearnt
    records[2]["cell"]["participation"] = 0.25
    where = {(w["trait"], w["value"]): w for w in fuzz_misses.where_they_miss(records)}
    assert where[("FedAvg learnt", "no FedAvg row")]["cells"] == 1 and where[("participation", "25% of the clients")]["cells"] == 1
    records[2]["rows"].insert(0, {"strategy": "fedavg", "accuracy": 0.5, "clusters": 1, "passes": False})
    records[2]["cell"]["participation"] = 0.5
    table = fuzz_misses.where_markdown(fuzz_misses.where_they_miss(records))
    assert "| family: mlp | 2 | 2 of 2 (100%) | 0 of 1 (0%) |" in table
    assert "| shift: label_swap | 1 | 1 of 1 (100%) | — |" in table
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "manifest.json").write_text(json.dumps({"git": {"commit": "0123456789abcdef", "dirty": False}}))
    commits = fuzz_misses.folder_commits([tmp_path / "a", tmp_path / "b"])  # b has no manifest
    assert commits == {"a": "0123456789abcdef"}
    folders = fuzz_misses.per_folder(records, {}, commits)
    assert "| `a` | 0123456 | 2 | 0 | 0 | no (none counted) | 1 | 1 | 1 | 2 |" in folders
    assert "| `b` |  | 1 | 0 | 0 | no (none counted) | 0 | 1 | — | 1 |" in folders
    # taken together: a cell counts when any clustered strategy passes it
    assert fuzz_misses.any_passes(records) == (3, 3)
    records[1]["rows"][2]["passes"] = False
    assert fuzz_misses.any_passes(records) == (2, 3)
    lone = dict(records[1], folder="c", rows=records[1]["rows"][:1])  # only FedAvg ran there: a dash
    assert fuzz_misses.any_passes([lone]) == (0, 0)
    (line,) = [row for row in fuzz_misses.per_folder([records[0], lone], {}, commits).splitlines()
               if row.startswith("| `c` |")]
    assert line.endswith("| — | — | — |")


def test_a_folder_run_longer_is_pooled_as_it_stood_at_the_pooled_rounds():
    """fuzz_misses.py reads a cell run 20 rounds and judged at 10 (``--judge-at``) by its round
    10; a cell of 10 rounds, or one run longer without that round judged, as it is."""
    import fuzz_misses

    def record(seed, rounds, at=None):
        row = {"strategy": "fedclust", "passes": False, "clusters": 1, "accuracy": 0.3}
        rec = {"cell": {"seed": seed, "shift": "rotation"}, "rounds": rounds, "groups_help": True, "rows": [row]}
        if at is not None:
            row["at_round"] = {"10": {"passes": at, "clusters": 3, "accuracy": 0.5}}
            rec["groups_help_at_round"] = {"10": False}
        return rec

    ten, longer, unjudged = fuzz_misses.pooled_view([record(1, 10), record(2, 20, at=True), record(3, 20)])
    assert ten["rows"][0]["passes"] is False and ten["rounds"] == 10
    assert longer["rounds"] == 10 and longer["groups_help"] is False and longer["judged_from"] == 20
    assert longer["rows"][0]["passes"] is True and longer["rows"][0]["clusters"] == 3
    assert unjudged["rounds"] == 20 and unjudged["rows"][0]["clusters"] == 1


def test_the_code_before_is_set_beside_the_same_cells(tmp_path):
    """fuzz_misses.py: a folder's ``-before`` sibling is read by seed; the passes, IID controls
    ending as one cluster and cells more than a point below FedAvg are counted over the cells
    both codes ran, per strategy; the folder table brackets the code before's passes only where
    it ran the strategy on every cell of the folder."""
    import fuzz_misses

    def record(seed, shift, rows):
        return {"cell": {"seed": seed, "shift": shift}, "true_groups": [0, 1] if shift != "iid" else [0, 0],
                "rows": [{"strategy": name, "passes": passes, "clusters": clusters, "loss_pp": loss}
                         for name, passes, clusters, loss in rows]}

    def write(folder, records):
        (folder / "cells").mkdir(parents=True)
        for rec in records:
            (folder / "cells" / f"{rec['cell']['seed']}.json").write_text(json.dumps(rec))

    now = [record(1, "rotation", [("fedclust", True, 2, 0.0), ("cfl", True, 2, 0.0)]),
           record(2, "iid", [("fedclust", True, 1, 0.0), ("cfl", True, 1, 0.0)]),
           record(3, "label_swap", [("fedclust", False, 1, 0.0), ("cfl", False, 3, 2.5)])]
    then = [record(1, "rotation", [("fedclust", False, 1, 0.0), ("cfl", False, 3, 4.0)]),
            record(2, "iid", [("fedclust", False, 3, 1.5)]),  # CFL not run here by the code before
            record(3, "label_swap", [("fedclust", True, 2, 0.0), ("cfl", False, 1, 0.0)])]
    write(tmp_path / "range", now)
    write(tmp_path / "range-before", then)
    write(tmp_path / "other", [record(4, "rotation", [("fedclust", True, 2, 0.0)])])  # no sibling
    records, _ = fuzz_misses.load([tmp_path / "range", tmp_path / "other"], [])
    before = fuzz_misses.load_before([tmp_path / "range", tmp_path / "other"])
    assert sorted(before) == [1, 2, 3] and {rec["folder"] for rec in before.values()} == {"range"}
    fedclust, cfl = fuzz_misses.before_and_after(records, before)
    assert fedclust == {"strategy": "fedclust", "cells": 3,
                        "before": {"passes": 1, "iid_controls": 1, "iid_one_cluster": 0, "below_fedavg": 1},
                        "now": {"passes": 2, "iid_controls": 1, "iid_one_cluster": 1, "below_fedavg": 0}}
    assert cfl["cells"] == 2 and cfl["before"]["passes"] == 0 and cfl["now"]["below_fedavg"] == 1  # seed 2 left out
    assert cfl["now"]["iid_controls"] == 0
    assert "| fedclust | 3 | 1 of 3 (33%) → 2 of 3 (67%) | 0 → 1 of 1 | 1 → 0 |" in fuzz_misses.before_markdown(
        [fedclust, cfl])
    table = fuzz_misses.per_folder(records, {}, {}, before)
    # (no FedAvg row here: the grouped cells count as not learnt); CFL's before ran 2 of the 3 cells
    assert "| `range` |  | 3 | 0 | 0 | no (none counted) | 2 | 2 (1) | 2 | 2 |" in table
    assert "| `other` |  | 1 | 0 | 0 | no (none counted) | 1 | 1 | — | 1 |" in table


def test_folders_that_ran_the_same_code_are_pooled_and_words_alone_do_not_part_them(tmp_path):
    """fuzz_misses.py: the code's fingerprint leaves docstrings and comments out, so two commits
    whose package differs only in words hash alike, and one that changes a line of code does
    not; folders are pooled by it, each strategy's passes with the code before's beside."""
    import subprocess

    import fuzz_misses

    def commit(repo, text, message):
        (repo / "pkg" / "m.py").write_text(text)
        subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message],
                       check=True)
        return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()

    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    first = commit(repo, 'def f():\n    """Adds one."""\n    return 1  # one\n', "first")
    words = commit(repo, 'def f():\n    """Returns one, in other words."""\n    # a comment\n    return 1\n', "words")
    code = commit(repo, 'def f():\n    """Returns one, in other words."""\n    return 2\n', "code")
    original = fuzz_misses.ROOT
    fuzz_misses.ROOT = repo
    try:
        prints = [fuzz_misses.code_fingerprint(c, "pkg") for c in (first, words, code)]
        assert prints[0] == prints[1] != prints[2] and fuzz_misses.code_fingerprint("f" * 40, "pkg") is None
    finally:
        fuzz_misses.ROOT = original

    def record(seed, folder, passes):
        return {"cell": {"seed": seed, "shift": "rotation"}, "true_groups": [0, 1], "folder": folder,
                "rows": [{"strategy": "fedclust", "passes": passes, "clusters": 2, "loss_pp": 0.0}]}

    records = [record(1, "a", True), record(2, "b", True), record(3, "b", False), record(4, "c", False)]
    before = {2: record(2, "b", False), 3: record(3, "b", True)}
    fingerprint = {"c1": "x", "c2": "x", "c3": "y"}
    original_fingerprint = fuzz_misses.code_fingerprint
    fuzz_misses.code_fingerprint = lambda commit, package="clusterfed": fingerprint[commit]
    try:
        groups = fuzz_misses.by_code(records, {"a": "c1", "b": "c2", "c": "c3"}, before)
    finally:
        fuzz_misses.code_fingerprint = original_fingerprint
    assert [g["folders"] for g in groups] == [["a", "b"], ["c"]]
    pooled = groups[0]["strategies"]["fedclust"]
    assert (pooled["cells"], pooled["passes"], pooled["share"]) == (3, 2, 2 / 3)
    assert (pooled["before"]["cells"], pooled["before"]["passes"]) == (2, 1)
    assert pooled["before"]["now"]["passes"] == 1  # the group's own passes on the cells the code before ran
    assert groups[1]["strategies"]["fedclust"]["before"] is None
    table = fuzz_misses.by_code_markdown(groups)
    assert "| `a`, `b` | c1, c2 | 3 | 2 of 3 (67%); before: 1 of 2 |" in table
    assert "| `c` | c3 | 1 | 0 of 1 (0%) |" in table
