"""Non-IID partitioners: sizes, disjointness, determinism, ground-truth groups, transforms."""

from __future__ import annotations

import numpy as np
import pytest

from clusterfed.datasets import (
    PARTITIONERS,
    DataSource,
    PartitionError,
    client_arrays,
    make_partition,
    partition_table,
    plot_partition,
    rotate_images,
)
from clusterfed.datasets.label_skew import parse_label_groups
from clusterfed.datasets.partition import _rotate_interpolated

C = 10
N = 2000
M = 20


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    return np.random.default_rng(42).permutation(np.repeat(np.arange(C), N // C))


@pytest.fixture(scope="module")
def source(labels) -> DataSource:
    # Random images: every pixel distinct, so any rotation is detectable.
    x = np.random.default_rng(7).standard_normal((N, 1, 6, 6)).astype(np.float32)
    return DataSource(name="fake", x=x, y=labels, num_classes=C)


def pools(part):
    return [np.concatenate([c.train_idx, c.test_idx]) for c in part.clients]


def client_labels(part, labels):
    return [set(labels[p].tolist()) for p in pools(part)]


# ---------------------------------------------------------------------------- all settings


@pytest.mark.parametrize("name", PARTITIONERS)
def test_every_partitioner_structure(labels, name):
    part = make_partition(labels, C, name=name, num_clients=M, seed=0)
    assert part.name == name and len(part.clients) == M
    everything = np.concatenate(pools(part))
    # No sample is used twice, neither within nor across clients.
    assert len(np.unique(everything)) == len(everything)
    assert everything.min() >= 0 and everything.max() < N
    if name == "dominant":
        assert len(everything) <= N
    else:
        assert len(everything) == N
    for c in part.clients:
        assert len(np.intersect1d(c.train_idx, c.test_idx)) == 0
        assert c.num_samples >= 10
        assert abs(len(c.test_idx) - 0.2 * c.num_samples) <= 1
    groups = part.groups()
    assert groups.shape == (M,) and groups.dtype == np.int64
    assert groups.min() >= 0 and groups.max() < part.num_groups


@pytest.mark.parametrize("name", PARTITIONERS)
def test_every_partitioner_is_seeded(labels, name):
    a = make_partition(labels, C, name=name, num_clients=M, seed=5)
    b = make_partition(labels, C, name=name, num_clients=M, seed=5)
    c = make_partition(labels, C, name=name, num_clients=M, seed=6)
    for ca, cb in zip(a.clients, b.clients):
        assert np.array_equal(ca.train_idx, cb.train_idx) and np.array_equal(ca.test_idx, cb.test_idx)
        assert ca.group == cb.group and ca.rotation == cb.rotation
        assert (ca.label_perm is None) == (cb.label_perm is None)
        if ca.label_perm is not None:
            assert np.array_equal(ca.label_perm, cb.label_perm)
    assert any(not np.array_equal(x.train_idx, y.train_idx) for x, y in zip(a.clients, c.clients))


def test_unknown_partitioner_lists_choices(labels):
    with pytest.raises(PartitionError) as err:
        make_partition(labels, C, name="pathological", num_clients=M)
    for name in PARTITIONERS:
        assert name in str(err.value)


def test_too_small_clients_error_names_client_and_fix(labels):
    with pytest.raises(PartitionError) as err:
        make_partition(labels[:500], C, name="iid", num_clients=100, min_samples=10)
    msg = str(err.value)
    assert "client 0" in msg and "5 samples" in msg
    assert "fewer clients" in msg and "min-samples" in msg


def test_train_test_split_is_stratified(labels):
    part = make_partition(labels, C, name="iid", num_clients=4, seed=0)
    for c in part.clients:
        tr = np.bincount(labels[c.train_idx], minlength=C)
        te = np.bincount(labels[c.test_idx], minlength=C)
        assert np.all(np.abs(te - 0.25 * tr) <= 2)


def test_test_fraction_zero_keeps_everything_for_training(labels):
    part = make_partition(labels, C, name="iid", num_clients=4, test_fraction=0.0)
    assert all(len(c.test_idx) == 0 and len(c.train_idx) == N // 4 for c in part.clients)


# ---------------------------------------------------------------------------- per setting


def test_iid(labels):
    part = make_partition(labels, C, name="iid", num_clients=7, seed=1)
    assert part.num_groups == 1 and set(part.groups().tolist()) == {0}
    sizes = [c.num_samples for c in part.clients]
    assert max(sizes) - min(sizes) <= 1


def test_dirichlet_groups_are_majority_labels(labels):
    part = make_partition(labels, C, name="dirichlet", num_clients=M, beta=0.1, seed=2)
    majority = [int(np.argmax(np.bincount(labels[p], minlength=C))) for p in pools(part)]
    groups = part.groups()
    for i in range(M):
        for j in range(M):
            assert (groups[i] == groups[j]) == (majority[i] == majority[j])
    # Skewed: a small beta leaves most clients with a strongly dominant label.
    shares = [np.bincount(labels[p]).max() / len(p) for p in pools(part)]
    assert np.median(shares) > 0.4


def test_dirichlet_gives_up_with_partition_error(labels):
    with pytest.raises(PartitionError, match="dirichlet"):
        make_partition(labels[:300], C, name="dirichlet", num_clients=25, beta=0.01, min_samples=10)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_label_skew_label_sets(labels, k):
    part = make_partition(labels, C, name="label-skew", num_clients=M, labels_per_client=k, seed=3)
    sets = client_labels(part, labels)
    for i, s in enumerate(sets):
        assert len(s) == k and i % C in s
    groups = part.groups()
    for i in range(M):
        for j in range(M):
            assert (groups[i] == groups[j]) == (sets[i] == sets[j])
    assert part.num_groups == len({frozenset(s) for s in sets})
    # Each label is split evenly among the clients holding it.
    for label in range(C):
        counts = [int(np.sum(labels[p] == label)) for p in pools(part) if label in set(labels[p].tolist())]
        assert max(counts) - min(counts) <= 1


def test_label_skew_rejects_bad_k(labels):
    with pytest.raises(PartitionError, match="labels_per_client"):
        make_partition(labels, C, name="label-skew", num_clients=M, labels_per_client=11)


def test_shards(labels):
    part = make_partition(labels, C, name="shards", num_clients=M, seed=4)
    shard = N // (2 * M)  # 50; every label fills exactly 4 shards here
    sets = client_labels(part, labels)
    for p, s in zip(pools(part), sets):
        assert len(p) == 2 * shard and 1 <= len(s) <= 2
    groups = part.groups()
    for i in range(M):
        for j in range(M):
            assert (groups[i] == groups[j]) == (sets[i] == sets[j])


@pytest.mark.parametrize("alpha, groups", [(0.7, 4), (0.9, 3), (1.0, 2)])
def test_dominant(labels, alpha, groups):
    part = make_partition(labels, C, name="dominant", num_clients=M, num_groups=groups, alpha=alpha, seed=5)
    assert part.num_groups == groups
    assert part.groups().tolist() == [i % groups for i in range(M)]
    sizes = {c.num_samples for c in part.clients}
    assert len(sizes) == 1
    n = sizes.pop()
    for c, p in zip(part.clients, pools(part)):
        counts = np.bincount(labels[p], minlength=C)
        dom = c.group % C
        assert counts[dom] == round(alpha * n)
        others = np.delete(counts, dom)
        assert others.max() - others.min() <= 1


def test_label_groups_default(labels):
    part = make_partition(labels, C, name="label-groups", num_clients=M, num_groups=7, seed=6)
    wanted = [set(range(0, 4)), set(range(3, 7)), set(range(4, 10)), set(range(10))]
    assert part.num_groups == 4  # taken from the groups string, not num_groups
    assert part.groups().tolist() == [i % 4 for i in range(M)]
    for c, s in zip(part.clients, client_labels(part, labels)):
        assert s <= wanted[c.group]
    # Label 3 is wanted by groups 0, 1 and 3: its samples are split evenly among them.
    per_group = np.zeros(4, dtype=int)
    for c, p in zip(part.clients, pools(part)):
        per_group[c.group] += int(np.sum(labels[p] == 3))
    assert per_group[2] == 0 and per_group[[0, 1, 3]].max() - per_group[[0, 1, 3]].min() <= 1
    # Dirichlet(1.0) client sizes: unequal within a group.
    assert len({c.num_samples for c in part.clients if c.group == 3}) > 1


def test_label_groups_pairs(labels):
    part = make_partition(labels, C, name="label-groups", num_clients=M, label_groups="0,1;2,3;4,5;6,7;8,9", seed=7)
    assert part.num_groups == 5
    for c, s in zip(part.clients, client_labels(part, labels)):
        assert s <= {2 * c.group, 2 * c.group + 1}


def test_parse_label_groups():
    assert parse_label_groups("0-2, 5;7", 10) == [[0, 1, 2, 5], [7]]
    assert parse_label_groups("", 5) == [[0, 1, 2, 3], [3, 4], [4], [0, 1, 2, 3, 4]]


@pytest.mark.parametrize("spec", ["0-3;;4", "a-b", "3-1", "0,,1", "0-3;4-"])
def test_label_groups_malformed(labels, spec):
    with pytest.raises(PartitionError) as err:
        make_partition(labels, C, name="label-groups", num_clients=M, label_groups=spec)
    assert repr(spec) in str(err.value) and "0-3;3-6;4-9;0-9" in str(err.value)


def test_label_groups_out_of_range(labels):
    with pytest.raises(PartitionError, match="out of range"):
        make_partition(labels, C, name="label-groups", num_clients=M, label_groups="0-3;8-12")


def test_rotation_groups_and_pixels(labels, source):
    part = make_partition(labels, C, name="rotation", num_clients=M, seed=8)
    assert part.num_groups == 4
    assert [c.rotation for c in part.clients[:4]] == [0.0, 90.0, 180.0, 270.0]
    for c in part.clients[:4]:
        x_tr, y_tr, x_te, _ = client_arrays(source, c)
        k = int(c.rotation // 90)
        assert np.array_equal(x_tr, np.rot90(source.x[c.train_idx], k, axes=(2, 3)))
        assert np.array_equal(x_te, np.rot90(source.x[c.test_idx], k, axes=(2, 3)))
        assert np.array_equal(y_tr, labels[c.train_idx])
        if k:
            assert not np.array_equal(x_tr, source.x[c.train_idx])


def test_rotation_free_angles(labels, source):
    part = make_partition(labels, C, name="rotation", num_clients=4, rotations="0, 45", seed=9)
    assert part.num_groups == 2 and [c.rotation for c in part.clients] == [0.0, 45.0, 0.0, 45.0]
    x_tr = client_arrays(source, part.clients[1])[0]
    assert x_tr.shape == (len(part.clients[1].train_idx), 1, 6, 6)
    assert not np.allclose(x_tr, source.x[part.clients[1].train_idx])
    with pytest.raises(PartitionError, match="rotations"):
        make_partition(labels, C, name="rotation", num_clients=4, rotations="0,ninety")


def test_interpolated_rotation_turns_like_rot90():
    x = np.random.default_rng(0).standard_normal((2, 3, 9, 9)).astype(np.float32)
    assert np.allclose(_rotate_interpolated(x, 90.0), np.rot90(x, 1, axes=(2, 3)), atol=1e-5)
    assert np.array_equal(rotate_images(x, -90), np.rot90(x, 3, axes=(2, 3)))
    assert rotate_images(x, 360) is x


def test_quantity(labels):
    part = make_partition(labels, C, name="quantity", num_clients=M, beta=0.5, seed=10)
    sizes = [c.num_samples for c in part.clients]
    assert part.num_groups == 1 and sum(sizes) == N
    assert min(sizes) >= 10 and max(sizes) > 3 * min(sizes)
    # The minimum is guaranteed even where plain Dirichlet draws would almost never meet it.
    many = make_partition(labels, C, name="quantity", num_clients=150, beta=0.5, seed=10)
    assert min(c.num_samples for c in many.clients) >= 10
    with pytest.raises(PartitionError, match="quantity"):
        make_partition(labels, C, name="quantity", num_clients=250, min_samples=10)


def test_label_swap(labels, source):
    part = make_partition(labels, C, name="label-swap", num_clients=M, num_groups=5, seed=11)
    assert part.num_groups == 5 and part.groups().tolist() == [i % 5 for i in range(M)]
    perms = {c.group: tuple(c.label_perm.tolist()) for c in part.clients}
    assert perms[0] == tuple(range(C))
    assert len(set(perms.values())) == 5
    assert all(sorted(p) == list(range(C)) for p in perms.values())
    for c in part.clients:
        assert perms[c.group] == tuple(c.label_perm.tolist())
        x_tr, y_tr, x_te, y_te = client_arrays(source, c)
        assert np.array_equal(y_tr, c.label_perm[labels[c.train_idx]])
        assert np.array_equal(y_te, c.label_perm[labels[c.test_idx]])
        assert np.array_equal(x_tr, source.x[c.train_idx])  # images untouched
    with pytest.raises(PartitionError, match="permutations"):
        make_partition(labels % 2, 2, name="label-swap", num_clients=6, num_groups=3)


# ---------------------------------------------------------------------------- reports


def test_table_and_plot(labels, tmp_path):
    part = make_partition(labels, C, name="label-swap", num_clients=6, num_groups=3, seed=0)
    table = partition_table(part, labels, C)
    lines = table.splitlines()
    assert "label-swap" in lines[0]
    assert lines[1].split()[:5] == ["client", "group", "n_train", "n_test", "rotation"]
    row = lines[2].split()
    c0 = part.clients[0]
    assert row[:4] == ["0", "0", str(len(c0.train_idx)), str(len(c0.test_idx))]
    assert sum(int(v) for v in row[5 : 5 + C]) == c0.num_samples
    assert "group 1:" in table
    path = tmp_path / "partition.png"
    plot_partition(part, labels, C, path)
    assert path.stat().st_size > 1000
