"""The checkpoint codec: a run's state round-trips exactly through JSON + npz without
pickle, and a file naming anything but clusterfed's own classes is refused unexecuted."""

from __future__ import annotations

import ast
import collections
import copy
import hashlib
import importlib
import io
import json
import math
import pickle
import types
from pathlib import Path

import numpy as np
import pytest

from clusterfed.clustering.bipartition import ClusterNode, ClusterTree, SplitDecision
from clusterfed.clustering.cluster_count import ClusterCountController, CountStep
from clusterfed.clustering.layercfl import CheckResult
from clusterfed.clustering.stability import StabilityTracker
from clusterfed.strategies import clustered_classes
from clusterfed.runner import checkpoint, state_decoder
from clusterfed.runner.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from clusterfed.runner.canonical_json import dumps_json
from clusterfed.runner.state_codec import decode, encode
from clusterfed.runner.state_rules import DecodeError
from clusterfed.core.exchange import ClientInfo

ROOT = Path(__file__).resolve().parents[1]


def assert_same(a, b, path="state", seen=None):
    """Equal values of the same types, arrays bit for bit, containers in the same order."""
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    seen = set() if seen is None else seen
    if (id(a), id(b)) in seen:  # a shared or self-referencing object, compared already
        return
    seen.add((id(a), id(b)))
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert a.tobytes() == b.tobytes() and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"), path
        if a.flags.c_contiguous or a.flags.f_contiguous:  # memory order kept (a strided view comes back compact)
            assert a.flags.f_contiguous == b.flags.f_contiguous and a.flags.c_contiguous == b.flags.c_contiguous, path
    elif isinstance(a, np.generic):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), path
    elif isinstance(a, np.random.Generator):
        assert type(a.bit_generator) is type(b.bit_generator) and a.bit_generator.state == b.bit_generator.state
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys or their order differ"
        for key in a:
            assert_same(a[key], b[key], f"{path}[{key!r}]", seen)
        assert getattr(a, "default_factory", None) is getattr(b, "default_factory", None), path
    elif isinstance(a, (list, tuple, collections.deque)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]", seen)
        assert getattr(a, "maxlen", None) == getattr(b, "maxlen", None), path
    elif isinstance(a, (set, frozenset)):
        assert a == b and list(a) == list(b), path
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b)
    elif isinstance(a, float):
        assert a == b and math.copysign(1.0, a) == math.copysign(1.0, b), path
    elif hasattr(a, "__dict__") and not isinstance(a, type):
        assert_same(vars(a), vars(b), f"{path}.__dict__", seen)
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def round_trip(obj):
    """Through the bytes a checkpoint holds: canonical JSON, and an npz read without pickle."""
    tree, arrays = encode(obj)
    text = dumps_json(tree)
    buffer = io.BytesIO()
    checkpoint._write_npz(buffer, arrays)
    with np.load(io.BytesIO(buffer.getvalue()), allow_pickle=False) as npz:
        loaded = {name: npz[name] for name in npz.files}
    return decode(json.loads(text), loaded), text


def every_kind_of_state():
    """A hand-made state holding every type a run's state may hold."""
    rng = np.random.default_rng(42)
    rng.random(7)  # not at the start of its stream
    tracker = StabilityTracker(window=3, xi=0.01, min_kept_fraction=0.1)
    for step in range(5):
        for key in ("c0", "c1"):
            tracker.add(key, "conv1", rng.normal(size=12) * (step + 1))
    tree = ClusterTree(["c0", "c1", "c2", "c3"], round=0)
    tree.split(0, [0, 1], [2, 3], round=2, gap=0.5)
    controller = ClusterCountController(m=6, w=0.1, hold_rounds=1, stabilizer="annealing", rng=rng)
    for r, ratio in enumerate([None, 0.5, -0.1, 0.3]):
        controller.update(ratio, r)
    nan_with_payload = (np.array([np.nan]).view(np.uint64) | np.uint64(5)).view(np.float64)
    matrix = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    shared = [1, 2]
    loop: list = ["loop"]
    loop.append(loop)
    return {
        "round": 3,
        "scalars": [None, True, False, 0, -7, 2**100, 1.5, -0.0, float("nan"), float("inf"), float("-inf"),
                    1e-310, 1 + 2j, "text ü \u2603 \ud800", b"\x00\xffbytes"],
        "containers": (frozenset({1, 2}), {3, 1, 2}, ("a", ("nested",)), [], (), set(), frozenset()),
        "str_keys": {"b": 1, "a": 2, "$t": "not a tag", "$x": 4},
        "sorted_keys": {"a": 1, "b": [1.25, {"c": None}]},
        "int_keys": {2: "two", 0: "zero", -1: "minus"},
        "tuple_keys": {("c0", "conv1"): 1, (1, 2): 2, None: 3, frozenset({1}): 4, 1.5: 5, np.int64(3): 6},
        "defaultdict": collections.defaultdict(list, {1: [2], 0: []}),
        "defaultdict_none": collections.defaultdict(None, {"x": 1}),
        "ordered": collections.OrderedDict([("z", 1), ("a", 2)]),
        "counter": collections.Counter({0: 3, 1: 5}),
        "deque": collections.deque([1, 2, 3], maxlen=4),
        "deque_unbounded": collections.deque(["x"]),
        "arrays": {
            "f32": np.linspace(-1, 1, 10, dtype=np.float32),
            "f64": np.array([1.0, -0.0, np.inf, -np.inf, np.nan, 5e-324]),
            "nan_payload": nan_with_payload,
            "f16": np.array([1.5, 65504.0], dtype=np.float16),
            "i8": np.array([-128, 127], dtype=np.int8),
            "u64": np.array([0, 2**64 - 1], dtype=np.uint64),
            "i64_2d": np.arange(6, dtype=np.int64).reshape(2, 3),
            "bool": np.array([True, False]),
            "c128": np.array([1 + 2j, np.nan * 1j]),
            "zero_d": np.array(3.25),
            "empty": np.zeros((0, 3), dtype=np.float32),
            "fortran": matrix,
            "view": np.arange(10.0)[::3],
            "big_endian": np.array([1, 2], dtype=">i4"),
            "unicode": np.array(["ab", "c"]),
        },
        "numpy_scalars": [np.float64(0.1), np.float64("nan"), np.float32(1.5), np.float16(2.0), np.int8(-3),
                          np.int64(2**62), np.uint64(2**64 - 1), np.bool_(True), np.complex64(1 - 1j)],
        "python_vs_numpy": [0.1, np.float64(0.1), 1, np.int64(1)],
        "shapes": {"conv1.weight": ((4, 1, 3, 3), np.dtype("float32")), "fc.bias": ((10,), np.dtype("<f8"))},
        "dtypes": [np.dtype(bool), np.dtype(np.int32), np.dtype(">f4"), np.dtype("U5")],
        "rng": rng,
        "clients": {"c0": ClientInfo("c0", 120, 1, {"0": 0.5, "1": 0.5}), "c1": ClientInfo("c1", 80, 0)},
        "algorithm": {
            "tree": tree,
            "node": ClusterNode(9, ["c9"], parent=None, depth=0, children=(10, 11), info={"round": 1}),
            "decision": SplitDecision("absolute", 0.1, 2.5, True, True, True, 0.2),
            "check": CheckResult(passed=False, alpha_cross_max=0.5, gamma_max=float("nan"), bound=0.5),
            "step": CountStep(1, None, 3, 1, "hold"),
            "tracker": tracker,
            "controller": controller,  # its rng is the same Generator as state["rng"]
            "merged": {4, 2},
        },
        "shared_a": shared,
        "shared_b": shared,
        "loop": loop,
    }


def test_every_kind_of_state_round_trips_exactly():
    state = every_kind_of_state()
    restored, text = round_trip(state)
    assert_same(state, restored)
    assert b"$" in text and b"NaN" not in text and b"Infinity" not in text
    # shared references stay shared, and a list that holds itself still does
    assert restored["algorithm"]["controller"].rng is restored["rng"]
    assert restored["shared_a"] is restored["shared_b"]
    assert restored["loop"][1] is restored["loop"]
    assert restored["arrays"]["fortran"].flags.f_contiguous
    # the restored objects work: the frozen dataclass is still frozen, the deque still bounded
    with pytest.raises(AttributeError):
        restored["algorithm"]["decision"].split = False
    restored["deque"].extend([4, 5])
    assert list(restored["deque"]) == [2, 3, 4, 5]
    restored["defaultdict"][7].append(1)
    assert restored["algorithm"]["tree"].members(1) == ["c0", "c1"]
    # the same state gives the same bytes
    assert dumps_json(encode(state)[0]) == text


def test_generator_continues_the_same_stream():
    state = every_kind_of_state()
    restored, _ = round_trip(state)
    expected = state["rng"].random(5), state["rng"].integers(0, 1000, 5)
    got = restored["rng"].random(5), restored["rng"].integers(0, 1000, 5)
    assert np.array_equal(expected[0], got[0]) and np.array_equal(expected[1], got[1])
    assert type(restored["rng"].bit_generator) is np.random.PCG64
    # the tracker and controller behave as the originals from here on
    update = np.linspace(0, 1, 12)
    assert state["algorithm"]["tracker"].add("c0", "conv1", update) == \
        restored["algorithm"]["tracker"].add("c0", "conv1", update)
    assert state["algorithm"]["controller"].update(-0.2, 9) == restored["algorithm"]["controller"].update(-0.2, 9)
    assert_same(state["algorithm"]["controller"], restored["algorithm"]["controller"])


def test_unsupported_values_are_named_by_their_path():
    class Foreign:
        pass

    tracker = StabilityTracker(window=2)
    tracker.foo = lambda: None
    with pytest.raises(TypeError, match=r"cannot save algorithm\.tracker\.foo: builtins\.function"):
        encode({"round": 1, "algorithm": {"tracker": tracker}})
    with pytest.raises(TypeError, match=r"cannot save extra\[2\]: .*Foreign is not a type the checkpoint codec handles"):
        encode({"extra": [1, 2, Foreign()]})
    with pytest.raises(TypeError, match=r"cannot save models\[3\]\.w: an array of object dtype"):
        encode({"models": {3: {"w": np.array([object()])}}})
    with pytest.raises(TypeError, match="default_factory"):
        encode({"d": collections.defaultdict(lambda: 0)})
    with pytest.raises(TypeError, match=r"cannot save legacy: numpy\.random\.mtrand\.RandomState is not a type"):
        encode({"legacy": np.random.RandomState(0)})
    with pytest.raises(TypeError, match=r"cannot save generators\[0\]: a Generator over"):
        encode({"generators": [np.random.Generator(OwnBitGenerator(0))]})


class OwnBitGenerator(np.random.PCG64):
    """A bit generator the codec does not know: refused, even though it derives from PCG64."""


@pytest.mark.parametrize("name", ["os:system", "builtins:eval", "subprocess:Popen", "clusterfedx.evil:Thing",
                                  "clusterfed.strategies.base:defaultdict", "clusterfed.nowhere:Thing",
                                  "clusterfed.core.exchange:Replies", "clusterfed.runner.checkpoint:os"])
def test_a_file_naming_a_foreign_class_is_refused_unexecuted(name, tmp_path, monkeypatch):
    imported = []
    real_import = importlib.import_module
    monkeypatch.setattr(state_decoder, "importlib", types.SimpleNamespace(
        import_module=lambda module, *a: imported.append(module) or real_import(module, *a)))
    monkeypatch.setattr("os.system", lambda *a: pytest.fail("os.system was called"))
    save_checkpoint(tmp_path, {"round": 1, "clients": {"c0": ClientInfo("c0", 1, 0)}})
    document = json.loads((tmp_path / "checkpoint.json").read_text())
    text = json.dumps(document["state"]).replace("clusterfed.core.exchange:ClientInfo", name)
    document["state"] = json.loads(text)
    document["sha256"] = checkpoint._document_digest(document)  # passes the checksum: only the codec stands
    (tmp_path / "checkpoint.json").write_bytes(dumps_json(document))
    with pytest.raises(CheckpointError, match=f"refusing class '{name}'"):
        load_checkpoint(tmp_path)
    assert all(module.startswith("clusterfed.") for module in imported)


def test_malformed_trees_are_refused():
    with pytest.raises(DecodeError, match="unknown entry 'pickle'"):
        decode({"$t": "pickle", "data": "..."}, {})
    with pytest.raises(DecodeError, match="names no earlier entry"):
        decode({"$t": "ref", "id": 3}, {})
    with pytest.raises(DecodeError, match="not in the array file"):
        decode({"$t": "ndarray", "ref": "a0", "dtype": "<f8", "shape": [1]}, {})
    with pytest.raises(DecodeError, match="the state says"):
        decode({"$t": "ndarray", "ref": "a0", "dtype": "<f8", "shape": [2]}, {"a0": np.zeros(1)})
    with pytest.raises(DecodeError, match="not part of the state"):
        decode({"round": 1}, {"a0": np.zeros(1)})
    with pytest.raises(DecodeError, match="refused"):
        decode({"$t": "dtype", "descr": "|O"}, {})
    with pytest.raises(DecodeError, match="factory"):
        decode({"$t": "defaultdict", "factory": "eval", "items": []}, {})
    with pytest.raises(DecodeError, match="unexpected key"):
        decode({"$x": 1}, {})


def test_a_tampered_or_missing_array_file_is_refused(tmp_path):
    path = save_checkpoint(tmp_path, {"round": 2, "w": np.arange(100, dtype=np.float32)})
    npz = next(tmp_path.glob("checkpoint-*.npz"))
    data = npz.read_bytes()
    npz.write_bytes(data[:-200] + bytes([data[-200] ^ 1]) + data[-199:])
    with pytest.raises(CheckpointError, match=r"checkpoint-.*\.npz is truncated or corrupt \(checksum mismatch\)"):
        load_checkpoint(tmp_path)
    npz.write_bytes(data[:100])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(tmp_path)
    npz.unlink()
    with pytest.raises(CheckpointError, match="half-written or partly copied"):
        load_checkpoint(tmp_path)
    npz.write_bytes(data)
    assert load_checkpoint(path)["round"] == 2


def test_json_corruption_foreign_files_and_other_versions_are_refused(tmp_path):
    save_checkpoint(tmp_path, {"round": 2, "loss": 0.5})
    text = (tmp_path / "checkpoint.json").read_bytes()
    assert b'"loss",0.5' in text
    cases = {
        text[: len(text) // 2]: "truncated or corrupt",
        text.replace(b'"loss",0.5', b'"loss",0.6'): r"truncated or corrupt \(checksum mismatch\)",
        b'{"some": "json"}': "not a clusterfed checkpoint",
        b"\x89PNG\r\n": "not a clusterfed checkpoint",
    }
    document = json.loads(text)
    document["format_version"] = 3
    document["sha256"] = checkpoint._document_digest(document)
    cases[dumps_json(document)] = "format version 3; this version of clusterfed reads format version 2"
    for content, message in cases.items():
        (tmp_path / "checkpoint.json").write_bytes(content)
        with pytest.raises(CheckpointError, match=message):
            load_checkpoint(tmp_path)


def old_pickle_checkpoint(folder: Path) -> Path:
    """A version-1 checkpoint whose payload would leave a mark if it were ever unpickled."""
    payload = pickle.dumps({"round": 1, "x": np.arange(3)})
    path = folder / "checkpoint.pkl"
    path.write_bytes(b"clusterfed-checkpoint v1\n" + hashlib.sha256(payload).digest() + payload)
    return path


def test_an_old_pickle_checkpoint_is_refused_and_never_unpickled(tmp_path, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("a checkpoint was unpickled")

    for name in ("loads", "load", "Unpickler"):
        monkeypatch.setattr(pickle, name, forbidden)
    monkeypatch.setattr(np, "load", lambda *a, **k: forbidden())
    path = old_pickle_checkpoint(tmp_path)
    for where in (tmp_path, path):
        with pytest.raises(CheckpointError, match=r"old pickle checkpoint .* will not load it, because unpickling "
                                                  r"a file can run arbitrary code\. Restart the run"):
            load_checkpoint(where)
    path.write_bytes(b"something else")
    with pytest.raises(CheckpointError, match="not a clusterfed checkpoint"):
        load_checkpoint(tmp_path)


def test_a_new_checkpoint_beside_an_old_one_is_the_one_loaded(tmp_path):
    old_pickle_checkpoint(tmp_path)
    save_checkpoint(tmp_path, {"round": 4})
    assert load_checkpoint(tmp_path) == {"round": 4}


def test_same_state_same_bytes_and_one_array_file(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    for folder in (first, second):
        folder.mkdir()
        save_checkpoint(folder, every_kind_of_state())
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes()
    restored = load_checkpoint(first)
    assert_same(every_kind_of_state(), restored)


def test_the_checkpoint_modules_do_not_use_pickle():
    for module in ("checkpoint.py", "state_codec.py", "state_encoder.py", "state_decoder.py", "state_rules.py",
                   "canonical_json.py"):
        tree = ast.parse((ROOT / "clusterfed" / "runner" / module).read_text())
        imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                    for alias in node.names}
        imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not imported & {"pickle", "_pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve"}, module
        assert "allow_pickle=True" not in (ROOT / "clusterfed" / "runner" / module).read_text()


@pytest.mark.parametrize("strategy", list(clustered_classes()))
@pytest.mark.end_to_end
def test_every_strategy_state_round_trips(strategy, tmp_path, monkeypatch, small_config):
    """What each strategy's runner saves after a few rounds comes back the same (types,
    arrays, order, shared Generators) from the files alone."""
    from clusterfed.runner import driver
    from clusterfed.simulation import simulate

    saved = {}
    real_save = driver.save_checkpoint
    monkeypatch.setattr(driver, "save_checkpoint",
                        lambda directory, state: saved.update(state=copy.deepcopy(state)) or real_save(directory, state))
    config = small_config(strategy=strategy, rounds=3, num_clients=8, out_dir=str(tmp_path / "run"))
    simulate(config, engine="inprocess", stream=None)
    assert_same(saved["state"], load_checkpoint(tmp_path / "run"))
