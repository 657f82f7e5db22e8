"""What the CFL family keeps per client between rounds (update-storage): the compact default
above sketch-above clients, the exact storage still selectable, the same clusters found on
sketches as on exact vectors, newcomers placed through a sketched split, and checkpoints."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from harness import hand, reply_to, round_of
from sklearn.metrics import adjusted_rand_score
from test_cfl import make_strategy as make_small
from test_cfl import run_round as run_small_round
from test_hicfl import UNIT, two_opposite_groups
from test_state_codec import assert_same, round_trip

from clusterfed.clustering.sketch import Sketch, count_sketch, in_sketch_space, split_budget
from clusterfed.strategies.base import steps
from clusterfed.strategies.cfl import CFL
from clusterfed.core.exchange import ClientInfo, Replies, TrainReply
from clusterfed.strategies.hicfl import HiCFL
from clusterfed.strategies.layercfl import LayerCFL
from clusterfed.clustering.vectors import similarity_record

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("bench_memory", ROOT / "benchmarks" / "bench_memory.py")
bench_memory = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_memory)

# a model of 14,426 numbers (about the 8×8 digits CNN's 13,706): 56 KB in float32
SHAPES = {"conv1.weight": (16, 1, 5, 5), "conv1.bias": (16,), "fc1.weight": (10, 1400), "fc1.bias": (10,)}
DIM = sum(int(np.prod(s)) for s in SHAPES.values())
BUDGET = 50 * 1024  # bytes per client


# ----------------------------------------------------------------------------- the sketches


def test_count_sketch_keeps_cosines_and_is_the_same_map_every_time():
    rng = np.random.default_rng(0)
    u, v = rng.standard_normal(20_000), rng.standard_normal(20_000)
    v = 0.6 * u + 0.8 * v  # cosine about 0.6
    sketch = count_sketch(20_000, 4096, seed=3)
    cos = lambda a, b: float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))  # noqa: E731
    assert abs(cos(sketch(u), sketch(v)) - cos(u, v)) < 0.05
    again = Sketch.from_spec(sketch.spec)
    np.testing.assert_array_equal(again(u), sketch(u))
    assert sketch(u).dtype == np.float32 and sketch(u).shape == (4096,)
    np.testing.assert_allclose(sketch(np.stack([u, v]))[1], sketch(v), rtol=1e-6)  # rows at once
    assert count_sketch(100, 4096, seed=3) is None  # short vectors are kept whole
    # a full vector is mapped, a sketched one left as it is
    np.testing.assert_array_equal(in_sketch_space(u, sketch.spec), sketch(u))
    np.testing.assert_array_equal(in_sketch_space(sketch(u), sketch.spec), sketch(u))


def test_coordinate_sample_and_budget_split():
    sample = Sketch("sample", 1000, 100, seed=1)
    x = np.arange(1000, dtype=np.float32)
    assert np.all(np.diff(sample.indexes) > 0) and len(sample.indexes) == 100
    np.testing.assert_array_equal(sample(x), x[sample.indexes])
    assert split_budget({"conv1": 520, "conv2": 25_050, "fc1": 8010}, 2048) == {"conv1": 520, "conv2": 764, "fc1": 764}
    with pytest.raises(ValueError, match="sketch size"):
        Sketch("count", 10, 20, seed=0)


# ----------------------------------------------------------------------------- bytes kept


@pytest.mark.parametrize("name", ["cfl", "layercfl", "hicfl"])
def test_default_storage_keeps_at_most_50_kb_per_client_above_sketch_above(name):
    clients = 1200  # above the default sketch-above = 1,000
    # LayerCFL on a feature skew compares the last conv layer: shorter than the sketch, kept whole
    config = {"skew": "feature"} if name == "layercfl" else {}
    strategy, keys, rounds = bench_memory.build(name, clients, SHAPES, config)
    bench_memory.drive(strategy, keys, rounds, 2)
    kept = bench_memory.array_bytes(strategy.state)
    assert strategy.state.sketched is True
    assert kept <= clients * BUDGET
    if name in ("cfl", "layercfl"):  # one float32 count sketch of 8,192 numbers per client (or the
        # decision layers whole in float32 when shorter: LayerCFL's conv layer here), nothing else
        dim = sum(int(np.prod(SHAPES[n])) for n in strategy.decision_names())
        assert kept == clients * min(strategy.params.sketch_dim, dim) * 4


def test_exact_storage_is_still_selectable_and_kept_below_sketch_above():
    exact, keys, rounds = bench_memory.build("cfl", 1200, SHAPES, {"update-storage": "exact"})
    bench_memory.drive(exact, keys, rounds, 2)
    # 10 examples a client: similarity-decay auto sums the updates in float64, as the paper's storage
    assert exact.state.sketched is False
    assert bench_memory.array_bytes(exact.state) == 1200 * DIM * 8
    small, keys, rounds = bench_memory.build("cfl", 300, SHAPES, {})  # auto, below sketch-above
    bench_memory.drive(small, keys, rounds, 2)
    assert small.state.sketched is False and bench_memory.array_bytes(small.state) == 300 * DIM * 8


# ----------------------------------------------------------------------------- the clusters found


def arrays_of(vector):
    bounds = np.cumsum([int(np.prod(shape)) for shape in SHAPES.values()])[:-1]
    parts = np.split(np.asarray(vector, dtype=np.float32), bounds)
    return {name: part.reshape(shape) for (name, shape), part in zip(SHAPES.items(), parts)}


def four_group_strategy(cls, **config):
    """24 clients in 4 groups (key i: group i mod 4; two pairs of groups), splits allowed from
    round 1, all admitted to the root."""
    # the criteria's timing (always met): the groups of a pair point alike (cosine 0.8), which
    # the evidence timing would not split; storage, not timing, is what these tests compare
    config = {"split-criteria": "absolute", "eps1": 1e6, "eps2": 1e-6, "min-split-round": 1, "merge": False,
              "split-timing": "criteria",
              # the groups are clear: the fixed silhouette threshold suffices
              "split-reference-draws": 0, **{k.replace("_", "-"): v for k, v in config.items()}}
    strategy, keys, rounds = bench_memory.build(cls.name, 24, SHAPES, config)
    given = hand(strategy)  # the harness hands the strategy what bench_memory's rounds hold
    given.active, given.train_config, given.clients = keys, dict(rounds(1).train_config), dict(rounds(1).clients)
    assert list(steps(strategy.admit(round_of(strategy, 1), keys))) == []
    return strategy, {key: int(key) % 4 for key in keys}


def group_updates(rng, group, noise=0.5):
    """Dense group directions (mass spread over every weight, as a network's update): pairs
    {0, 1} and {2, 3} share a component, so the tree has two levels."""
    basis = np.random.default_rng(99).standard_normal((6, DIM)) / np.sqrt(DIM)
    return 2.0 * basis[group // 2] + 1.0 * basis[2 + group] + noise * rng.standard_normal(DIM) / np.sqrt(DIM)


def run_round(strategy, server_round, vectors):
    """One round of replies: key -> its full update vector, from its current cluster."""
    strategy.after_train(round_of(strategy, server_round), [update_reply(strategy, key, vector) for key, vector in vectors.items()])


def update_reply(strategy, key, vector):
    cluster = strategy.assignment[key]
    return TrainReply(key=key, cluster=cluster, arrays=arrays_of(vector), sent=strategy.models[cluster],
                      num_examples=50, train_loss=0.0, metrics={}, is_update=True)


@pytest.mark.parametrize("cls", [CFL, LayerCFL])
def test_sketched_storage_finds_the_clusters_exact_storage_finds(cls):
    found = {}
    for storage in ("exact", "sketch"):
        layers = {"cluster_layers": "fc"} if cls is LayerCFL else {}
        strategy, groups = four_group_strategy(cls, update_storage=storage, sketch_dim=256, **layers)
        rng = np.random.default_rng(0)
        for server_round in range(1, 5):
            run_round(strategy, server_round, {k: group_updates(rng, g) for k, g in groups.items()})
        keys = sorted(groups, key=int)
        found[storage] = [strategy.assignment[k] for k in keys]
        assert adjusted_rand_score([groups[k] for k in keys], found[storage]) == 1.0
        assert strategy.state.sketched is (storage == "sketch")
    assert found["sketch"] == found["exact"]


def test_a_newcomer_descends_a_sketched_split_to_its_group():
    strategy, groups = four_group_strategy(CFL, update_storage="sketch", sketch_dim=256)
    rng = np.random.default_rng(1)
    for server_round in range(1, 5):
        run_round(strategy, server_round, {k: group_updates(rng, g) for k, g in groups.items()})
    assert all(route["sketch"]["size"] == 256 for route in strategy.state.routes.values())
    leaf_of_group = {g: strategy.assignment[k] for k, g in groups.items()}
    for group in range(4):
        key = f"new{group}"
        hand(strategy).clients[key] = ClientInfo(key, 50, group)
        admission = iter(steps(strategy.admit(round_of(strategy, 5), [key])))
        try:
            asks = next(admission)
            while True:  # one placement upload per split passed, a full update of the split's arrays
                replies = Replies([reply_to(ask, {n: v for n, v in arrays_of(group_updates(rng, group)).items()
                                                  if n in ask.upload}) for ask in asks])
                asks = admission.send(replies)
        except StopIteration:
            pass
        assert strategy.assignment[key] == leaf_of_group[group]


def test_hicfl_on_sampled_weights_splits_when_and_as_exact_storage_does():
    splits = {}
    for storage in ("exact", "sketch"):
        groups, updates = two_opposite_groups(0, oscillate_until=6)
        strategy = make_small(HiCFL, groups, update_storage=storage, sketch_dim=64, **UNIT)
        for server_round in range(1, 12):
            run_small_round(strategy, server_round, updates(server_round))
        assert strategy.state.sketched is (storage == "sketch")
        splits[storage] = [(s["round"], sorted(map(sorted, s["members"]))) for s in strategy.state.splits]
    assert splits["sketch"] == splits["exact"] and splits["exact"][0][0] == 9
    assert sorted(strategy.state.samples) == ["conv1", "fc1"]  # 32 of 80 and 32 of 84 weights


# ----------------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("cls", [CFL, HiCFL])
def test_sketched_state_round_trips_and_the_run_continues_the_same(cls):
    if cls is HiCFL:
        groups, updates = two_opposite_groups(0, oscillate_until=6)
        make = lambda: make_small(HiCFL, groups, update_storage="sketch", sketch_dim=64, **UNIT)  # noqa: E731
        step = run_small_round
    else:
        groups = four_group_strategy(CFL)[1]
        rng = np.random.default_rng(2)
        vectors = [{k: group_updates(rng, g) for k, g in groups.items()} for _ in range(12)]
        make = lambda: four_group_strategy(CFL, update_storage="sketch", sketch_dim=256)[0]  # noqa: E731
        updates = lambda server_round: vectors[server_round - 1]  # noqa: E731
        step = run_round
    original = make()
    for server_round in range(1, 8 if cls is CFL else 10):
        step(original, server_round, updates(server_round))
    saved, _ = round_trip(original.get_state())
    assert_same(original.get_state(), saved)
    resumed = make()
    resumed.set_state(saved)
    for strategy in (original, resumed):
        for server_round in (10, 11) if cls is HiCFL else (8, 9):
            step(strategy, server_round, updates(server_round))
    assert resumed.assignment == original.assignment and resumed.state.splits == original.state.splits


def test_a_split_records_the_similarity_of_at_most_200_of_its_clients():
    keys = [str(i) for i in range(500)]
    record = similarity_record(keys, np.eye(500))
    assert record["clients"] == 500 and len(record["keys"]) == 200 and np.shape(record["matrix"]) == (200, 200)
    assert record["keys"][0] == "0" and record["keys"][-1] == "499"
    assert np.allclose(record["matrix"], np.eye(200))  # the chosen clients' own rows and columns
    assert "clients" not in similarity_record(keys[:20], np.eye(20))


def test_selection_keeps_the_final_layer_as_sent():
    strategy, keys, rounds = bench_memory.build("selection", 40, SHAPES, {})
    bench_memory.drive(strategy, keys, rounds, 2)
    assert strategy.state.latest and all(v.dtype == np.float32 for v in strategy.state.latest.values())
