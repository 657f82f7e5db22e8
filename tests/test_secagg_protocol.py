"""SecAgg+ inside groups: the real client mod on real Flower Messages (through Flower's protobuf
serialisation) against GroupProtocol instances for two groups at once. No training."""

from __future__ import annotations

import numpy as np
import pytest
from secagg_harness import Federation, model, plain_mean, trained, weight

from clusterfed.secagg import GroupProtocol, GroupResult, SecAggError, SecAggSettings, run_groups, vectors, wire

GROUPS = {"A": [f"a{i}" for i in range(5)], "B": [f"b{i}" for i in range(4)]}
MODELS = {"A": model(1), "B": model(2)}
SETTINGS = SecAggSettings()
BOUND = 2 * SETTINGS.clipping_range / SETTINGS.quantization_range  # the stated error of the weighted mean


def run(drop=frozenset(), groups=GROUPS, settings=SETTINGS, fed=None):
    fed = fed or Federation([k for members in groups.values() for k in members], MODELS, drop=drop)
    protocols = {g: GroupProtocol(members, settings, session=f"round-1/{g}", seed=0) for g, members in groups.items()}
    return run_groups(protocols, fed.exchange), protocols, fed


def assert_mean(result: GroupResult, group: str, members: list[str]) -> None:
    expected = plain_mean([trained(MODELS[group], k) for k in members], [weight(k) for k in members])
    assert result.members == tuple(members)
    assert result.total_weight == sum(weight(k) for k in members)
    for name, value in expected.items():
        if name == "steps":  # an integer buffer: the rounded mean, its own dtype and 0-d shape
            assert result.arrays()[name].dtype == np.int64 and result.arrays()[name].shape == ()
            assert result.arrays()[name] == np.rint(value)
            continue
        assert np.max(np.abs(result.means["arrays"][name] - value)) < BOUND
        assert np.max(np.abs(result.sums["arrays"][name] - value * result.total_weight)) < BOUND * result.total_weight
        assert result.arrays()[name].dtype == np.float32


def test_two_groups_give_each_its_weighted_mean_within_the_quantization_error():
    outcome, _, fed = run()
    for group, members in GROUPS.items():
        assert isinstance(outcome[group], GroupResult)
        assert_mean(outcome[group], group, members)
        assert outcome[group].clipped == 0 and outcome[group].dropped == {}
    # the clear part of a masked reply: the metrics without the weight (it travels masked)
    collect = [c for c in fed.received if wire.MASKED in c]
    assert collect and all(dict(c["metrics"]) == {"train-loss": 0.25} for c in collect)


def test_the_server_never_holds_an_individual_unmasked_update(monkeypatch):
    plain: list[np.ndarray] = []  # each client's [w, clipped, w*q], recorded on the client side
    quantize = vectors.quantize

    def recording(values, clipping_range, levels, rng):
        quantized, clipped = quantize(values, clipping_range, levels, rng)
        plain.append(quantized)
        return quantized, clipped

    monkeypatch.setattr(vectors, "quantize", recording)
    taken: list[dict] = []  # every reply the server side was handed
    real_take = GroupProtocol.take
    monkeypatch.setattr(GroupProtocol, "take", lambda self, replies: (
        taken.extend(r for r in replies.values() if r), real_take(self, replies))[1])
    outcome, _, fed = run()
    assert all(isinstance(r, GroupResult) for r in outcome.values())
    vectors_seen = [r[wire.VECTOR] for r in taken if wire.VECTOR in r]
    assert len(plain) == len(vectors_seen) == 9
    for seen in vectors_seen:
        for quantized in plain:  # masked: about as many equal values as chance gives (~0)
            assert np.mean(seen[vectors.HEADER:].astype(np.uint64) == quantized) < 0.01
        # and spread over the modulus: a plain weighted vector lies below max_weight * levels
        assert np.mean(seen.astype(np.uint64) <= SETTINGS.max_weight * SETTINGS.quantization_range) < 0.01
    # nothing else carries a client's values: no arrays record, and no run of a client's
    # float32 bytes anywhere in what the server received
    assert not any("arrays" in content for content in fed.received)
    received = b"".join(bytes(str(dict(c.items())), "latin-1") for c in fed.received)
    received += b"".join(r[wire.VECTOR].tobytes() for r in taken if wire.VECTOR in r)
    for group, members in GROUPS.items():
        for key in members:
            assert trained(MODELS[group], key)["layer1.w"][:8].tobytes() not in received


@pytest.mark.parametrize("stage", [wire.COLLECT, wire.UNMASK])
def test_one_client_dropping_after_the_key_exchange_is_tolerated(stage):
    outcome, protocols, _ = run(drop={("a2", stage)})
    completed = [k for k in GROUPS["A"] if k != "a2"] if stage == wire.COLLECT else GROUPS["A"]
    assert_mean(outcome["A"], "A", completed)  # dropped before its masked vector: left out; after: kept
    assert outcome["A"].dropped == {"a2": f"{stage}: no reply"}
    assert_mean(outcome["B"], "B", GROUPS["B"])


def test_dropping_below_the_threshold_ends_with_the_stated_error_and_the_other_group_finishes():
    outcome, protocols, _ = run(drop={("b1", wire.COLLECT), ("b2", wire.COLLECT)})
    assert isinstance(outcome["B"], SecAggError)
    assert "failed at collect: 2 member(s) left, fewer than 3" in str(outcome["B"])
    assert "no member's values were revealed" in str(outcome["B"])
    assert protocols["B"].stage == wire.FAILED
    with pytest.raises(SecAggError, match="no result"):
        protocols["B"].result()
    assert_mean(outcome["A"], "A", GROUPS["A"])


def test_a_client_dropping_at_setup_or_share_keys_is_left_out_cleanly():
    outcome, _, _ = run(drop={("a0", wire.SETUP), ("a4", wire.SHARE_KEYS)},
                        groups={"A": GROUPS["A"] + ["a5"], "B": GROUPS["B"]})
    assert_mean(outcome["A"], "A", ["a1", "a2", "a3", "a5"])


def test_secaggplus_neighbourhoods_in_a_larger_group():
    members = [f"a{i}" for i in range(9)]
    settings = SecAggSettings(shares=5, threshold=3)
    outcome, protocols, _ = run(drop={("a3", wire.COLLECT)}, groups={"A": members}, settings=settings)
    assert all(len(n) == 5 for n in protocols["A"].neighbours.values())
    assert_mean(outcome["A"], "A", [k for k in members if k != "a3"])
    # a member asks only its neighbourhood for keys: bytes grow with shares, not with the group
    assert max(protocols["A"].ledger.down[wire.SHARE_KEYS].values()) < 5 * 1200


def test_bytes_per_stage_are_counted_per_client():
    outcome, protocols, fed = run()
    for group, members in GROUPS.items():
        ledger = protocols[group].ledger
        for stage in wire.STAGES:
            assert set(ledger.down[stage]) == set(ledger.up[stage]) == set(members)
            for member in members:
                down, up = fed.wire_bytes[stage][member]
                # the protocol's own count (numbers as 8 bytes) against Flower's serialised size
                # (varint numbers, record framing): close, and the masked vector dominates the upload
                assert 0 < ledger.up[stage][member] <= 2 * up and 0 < up <= 2 * ledger.up[stage][member] + 64
                if stage != wire.COLLECT:  # the collect message also carries the model (the driver's bytes)
                    assert 0 < ledger.down[stage][member] <= 2 * down and down <= 2 * ledger.down[stage][member] + 64
        size = vectors.HEADER + vectors.layout_size(outcome[group].layout)
        assert all(up >= 8 * size for up in ledger.up[wire.COLLECT].values())
        assert set(ledger.seconds) == set(wire.STAGES)


def test_values_outside_the_clipping_range_are_clipped_and_only_their_total_is_revealed():
    def far(sent, key):
        out = trained(sent, key)
        out["layer0.w"] = out["layer0.w"].copy()
        out["layer0.w"][0] = 100.0
        return out

    from secagg_harness import make_app

    keys = GROUPS["A"]
    fed = Federation(keys, MODELS, app=make_app(far))
    outcome, _, _ = run(groups={"A": keys}, fed=fed)
    assert outcome["A"].clipped == len(keys)
    assert outcome["A"].means["arrays"]["layer0.w"][0] == pytest.approx(SETTINGS.clipping_range, abs=BOUND)


def test_the_mod_leaves_numpys_global_random_state_alone():
    state = np.random.get_state()[1].copy()
    run(groups={"B": GROUPS["B"]})
    assert np.array_equal(np.random.get_state()[1], state)


def test_a_member_whose_reply_does_not_fit_is_left_out_and_its_masks_removed():
    from secagg_harness import make_app

    def odd(sent, key):
        out = trained(sent, key)
        if key == "a1":
            out["extra"] = np.zeros(3, dtype=np.float32)  # arrays that differ from the group's
        return out

    keys = GROUPS["A"]
    outcome, protocols, _ = run(groups={"A": keys}, fed=Federation(keys, MODELS, app=make_app(odd)),
                                settings=SecAggSettings(max_weight=2**20))
    assert_mean(outcome["A"], "A", [k for k in keys if k != "a1"])
    assert outcome["A"].dropped == {"a1": "collect: its arrays (names, shapes, dtypes) differ from the group's"}
    # a weight above max_weight fails that member's reply on the client: it counts as dropped
    heaviest = max(keys, key=weight)
    outcome, _, _ = run(groups={"A": keys}, settings=SecAggSettings(max_weight=weight(heaviest) - 1))
    assert outcome["A"].dropped == {heaviest: "collect: no reply"}
    assert_mean(outcome["A"], "A", [k for k in keys if k != heaviest])


def test_equal_weights_without_a_weight_key():
    outcome, _, _ = run(groups={"B": GROUPS["B"]}, settings=SecAggSettings(weight_key=None))
    expected = plain_mean([trained(MODELS["B"], k) for k in GROUPS["B"]], [1] * len(GROUPS["B"]))
    assert outcome["B"].total_weight == len(GROUPS["B"])
    assert np.max(np.abs(outcome["B"].means["arrays"]["layer1.w"] - expected["layer1.w"])) < BOUND


def test_the_same_inputs_give_the_same_sum():
    first, _, _ = run(groups={"B": GROUPS["B"]})
    again, _, _ = run(groups={"B": GROUPS["B"]})  # fresh keys and masks, same rounding
    for name, value in first["B"].means["arrays"].items():
        assert np.array_equal(value, again["B"].means["arrays"][name])
