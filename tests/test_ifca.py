"""IFCA: the K starting models, the multi-model message contract on both sides, the
algorithm fed replies by hand, and whole in-process runs on digits."""

import json

import numpy as np
import pytest
from harness import SHAPES, drive_round, hand, make, theta0, trained

from clusterfed import protocol
from clusterfed.clustering.ifca import kmeanspp_seeds, nearest_seed, random_initialisations
from clusterfed.runner.validation import ReplyRejected, parse_train_reply
from clusterfed.strategies import strategy_class
from clusterfed.core.exchange import CHOICE, CHOICES, Ask, pack_models, unpack_model

FOUR = {str(i): i % 2 for i in range(4)}


# ------------------------------------------------------------------ pure pieces
def test_random_initialisations_keep_theta0_first_and_constant_arrays():
    base = {"w": np.linspace(-0.3, 0.3, 12, dtype=np.float32).reshape(3, 4), "bn.weight": np.ones(3, np.float32),
            "bn.count": np.array(5, dtype=np.int64)}
    models = random_initialisations(base, 3, np.random.default_rng(1))
    assert len(models) == 3
    assert all(np.array_equal(models[0][n], base[n]) for n in base)
    for model in models[1:]:
        assert not np.array_equal(model["w"], base["w"])
        assert np.abs(model["w"]).max() <= 0.3 + 1e-7 and model["w"].dtype == np.float32
        assert np.array_equal(model["bn.weight"], base["bn.weight"]) and model["bn.count"] == 5
    assert not np.array_equal(models[1]["w"], models[2]["w"])
    again = random_initialisations(base, 3, np.random.default_rng(1))
    assert np.array_equal(again[2]["w"], models[2]["w"])


def test_kmeanspp_picks_one_seed_per_separated_blob():
    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    X = np.concatenate([c + rng.normal(0, 0.1, (5, 2)) for c in centres])
    for seed in range(5):
        seeds, potential = kmeanspp_seeds(X, 3, np.random.default_rng(seed))
        assert sorted(i // 5 for i in seeds) == [0, 1, 2]
        assert potential < 1.0
        assert list(nearest_seed(X, seeds)) == [[i // 5 for i in seeds].index(j // 5) for j in range(15)]
    with pytest.raises(ValueError):
        kmeanspp_seeds(X, 16, rng)


def test_kmeanspp_with_duplicate_rows_still_gives_k_distinct_seeds():
    seeds, potential = kmeanspp_seeds(np.zeros((4, 3)), 3, np.random.default_rng(0))
    assert len(set(seeds)) == 3 and potential == 0.0


# --------------------------------------------------------- the message contract
def test_pack_and_unpack_models():
    a, b = theta0(1.0), theta0(2.0)
    packed = pack_models([a, b])
    assert set(packed) == {f"m{k}.{n}" for k in (0, 1) for n in SHAPES}
    assert all(np.array_equal(unpack_model(packed, 1)[n], b[n]) for n in SHAPES)


def _reply(arrays, metrics):
    from flwr.app import MetricRecord, RecordDict

    return RecordDict({protocol.ARRAYS: protocol.to_array_record(arrays), protocol.METRICS: MetricRecord(metrics)})


def test_reply_is_validated_against_the_model_the_client_chose():
    shapes = {n: (v.shape, v.dtype) for n, v in theta0().items()}
    ask = Ask("3", pack_models([theta0(1.0), theta0(2.0), theta0(3.0)]),
              {"cluster-id": -1, "upload": "full", "return": "update", CHOICES: 3})
    update = {n: np.full(v.shape, 0.5, v.dtype) for n, v in theta0().items()}
    reply = parse_train_reply(_reply(update, {"num-examples": 9, "train-loss": 0.3, CHOICE: 2}), ask, shapes)
    assert reply.cluster == 2
    assert all(np.all(reply.sent[n] == 3.0) and np.all(reply.weights[n] == 3.5) for n in SHAPES)
    for bad in (3, -1, 1.5, None):
        metrics = {"num-examples": 9, "train-loss": 0.3, **({} if bad is None else {CHOICE: bad})}
        with pytest.raises(ReplyRejected) as error:
            parse_train_reply(_reply(update, metrics), ask, shapes)
        assert error.value.kind == "metrics"
    prefixed = {f"m0.{n}": v for n, v in update.items()}  # a client that returns the packed names
    with pytest.raises(ReplyRejected) as error:
        parse_train_reply(_reply(prefixed, {"num-examples": 9, "train-loss": 0.3, CHOICE: 0}), ask, shapes)
    assert error.value.kind == "names"


def test_client_chooses_by_training_loss_even_where_its_test_split_would_choose_otherwise(monkeypatch):
    """The client's training labels are all a, its test labels all b; of a model that
    predicts a and one that predicts b it must choose the one predicting a, in either
    order (choosing by the test split would pick the other)."""
    from flwr.supercore.task_identity import TaskIdentity
    from test_client_app import _call

    import clusterfed.client_app as client_app

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1

    real = client_app._client_data

    def skewed(config, context):
        data = real(config, context)
        a, b = int(data.y_train[0]), int((data.y_train[0] + 1) % data.num_classes)
        return client_app.ClientData(data.x_train, np.full_like(data.y_train, a), data.x_test,
                                     np.full_like(data.y_test, b), data.true_group, data.num_classes, data.input_shape)

    monkeypatch.setattr(client_app, "_client_data", skewed)
    from clusterfed.config import parse_config
    from clusterfed.server_app import initial_arrays

    base = {n: v.numpy() for n, v in initial_arrays(parse_config({"num-clients": 4})).items()}
    final = [n for n in base if n.startswith("fc2")]
    probe = client_app._load_client_data  # label a of partition 2 (the client _call builds)
    spec = tuple(sorted({**protocol.client_spec(parse_config({"num-clients": 4, "partitioner": "iid"}).to_flower())}
                        .items()))
    a = int(probe(spec, 2).y_train[0])
    b = (a + 1) % probe(spec, 2).num_classes

    def favouring(label):
        model = {n: v.copy() for n, v in base.items()}
        model[final[0]] = np.zeros_like(base[final[0]])
        bias = np.zeros_like(base[final[1]])
        bias[label] = 10.0
        model[final[1]] = bias
        return model

    packed = protocol.to_array_record(pack_models([favouring(b), favouring(a)]))
    reply, _ = _call({CHOICES: 2, "cluster-id": -1}, packed)
    metrics = reply.content[protocol.METRICS]
    assert metrics[CHOICE] == 1  # the model that fits the training data (model 0 fits the test data)
    assert set(reply.content[protocol.ARRAYS]) == set(base)
    packed = protocol.to_array_record(pack_models([favouring(a), favouring(b)]))
    reply, _ = _call({CHOICES: 2, "cluster-id": -1}, packed)
    assert reply.content[protocol.METRICS][CHOICE] == 0


# ------------------------------------------------------- the algorithm by hand
def test_every_client_gets_all_k_models_and_joins_the_cluster_it_chose():
    algorithm = make(strategy_class("ifca"), FOUR, num_clusters=3, seed=4)
    starts = {c: {n: v.copy() for n, v in m.items()} for c, m in algorithm.models.items()}
    choice = {"0": 2, "1": 0, "2": 2, "3": 0}
    shift = {"0": 1.0, "1": 3.0, "2": 2.0, "3": 5.0}

    def respond(ask):
        sent = unpack_model(ask.model, choice[ask.key])
        return {n: v + np.float32(shift[ask.key]) for n, v in sent.items()}, {CHOICE: choice[ask.key]}

    (asks,) = drive_round(algorithm, 1, respond, {"0": 10, "1": 10, "2": 30, "3": 10})
    assert all(a.choices == 3 and set(a.model) == set(pack_models([theta0()] * 3)) for a in asks)
    assert algorithm.assignment == choice
    for n in SHAPES:
        np.testing.assert_allclose(algorithm.models[2][n], starts[2][n] + (1.0 * 10 + 2.0 * 30) / 40, rtol=1e-5)
        np.testing.assert_allclose(algorithm.models[0][n], starts[0][n] + 4.0, rtol=1e-5)
        np.testing.assert_array_equal(algorithm.models[1][n], starts[1][n])  # nobody chose it
    evaluated = algorithm.evaluation_models(1, hand(algorithm).active)
    assert {k: c for k, (c, _) in evaluated.items()} == choice
    # a later round's choice moves the client
    choice["1"] = 1
    drive_round(algorithm, 2, respond)
    assert algorithm.assignment["1"] == 1 and algorithm.evaluation_models(2, hand(algorithm).active)["1"][0] == 1


def test_restarts_keep_the_initialisation_with_the_lowest_mean_training_loss():
    algorithm = make(strategy_class("ifca"), FOUR, num_clusters=2, ifca_restarts=3, seed=1)
    candidates = [[{n: v.copy() for n, v in m.items()} for m in models] for models in algorithm.state.candidates]
    losses = iter([0.9, 0.2, 0.5])
    seen = []

    def respond(ask):
        if not seen or seen[-1] is not ask.model:
            seen.append(ask.model)
            respond.loss = next(losses)
        return trained(ask, 0.0), {}, respond.loss

    batches = drive_round(algorithm, 1, respond)
    assert len(batches) == 3 and batches.diagnostics["ifca_restart_kept"] == 1
    for c in (0, 1):
        for n in SHAPES:
            np.testing.assert_allclose(algorithm.models[c][n], candidates[1][c][n], rtol=1e-6)
    assert len(drive_round(algorithm, 2, lambda ask: trained(ask, 0.0))) == 1  # restarts only in round 1


def test_kmeanspp_init_warms_up_on_theta0_then_seeds_from_the_clients_models():
    algorithm = make(strategy_class("ifca"), {str(i): i % 2 for i in range(6)}, num_clusters=2,
                     ifca_init="kmeans++", seed=2)
    batches = drive_round(algorithm, 1, lambda ask: trained(ask, 1.0 if int(ask.key) % 2 else -1.0))
    (warmup,) = batches
    assert all(a.choices == 0 and a.config["phase"] == "warmup" for a in warmup)
    assert batches.diagnostics["decision"].startswith("IFCA warm-up: the clients trained θ0; its 2 models are "
                                                      "k-means++ seeds")
    assert "compares the training losses of its 2 models" in batches.diagnostics["decision"]
    assert algorithm.state.idle == {} and algorithm.state.last_won == {}  # nobody chose in the warm-up
    assert sorted(float(m["fc2.bias"][0]) for m in algorithm.models.values()) == [-1.0, 1.0]
    # provisional membership: the nearest seed, which here is the own group's
    assert len({algorithm.assignment[k] for k in ("0", "2", "4")}) == 1
    assert algorithm.assignment["0"] != algorithm.assignment["1"]
    (asks,) = drive_round(algorithm, 2, lambda ask: trained(ask, 0.0))
    assert all(a.choices == 2 for a in asks)


# ----------------------------------------------------------- whole runs (digits)
def _rounds(out_dir):
    return [json.loads(line) for line in open(f"{out_dir}/rounds.jsonl")]


@pytest.mark.end_to_end
def test_ifca_recovers_rotation_groups_and_its_downlink_is_k_models_per_client(small_config, tmp_path):
    from clusterfed.server_app import initial_arrays
    from clusterfed.simulation import simulate

    config = small_config(strategy="ifca", partitioner="rotation", rotations="0,180", num_groups=2, num_clients=6,
                          num_clusters=2, rounds=4, local_epochs=2, seed=1, fraction_evaluate=0.0,
                          out_dir=str(tmp_path / "ifca"))
    simulate(config, engine="inprocess", stream=None)
    rounds = _rounds(config.out_dir)
    model_bytes = sum(a.numpy().nbytes for a in initial_arrays(config).values())
    assert all(r["bytes_down"] == 2 * model_bytes * 6 for r in rounds)
    assert all(r["bytes_up"] == model_bytes * 6 for r in rounds)
    assert rounds[-1]["ari"] == 1.0
    # evaluation never reaches a choice: the same run with every client evaluated chooses alike
    again = small_config(**{**{k.replace("-", "_"): v for k, v in config.to_flower().items()},
                            "fraction_evaluate": 1.0, "out_dir": str(tmp_path / "evaluated")})
    simulate(again, engine="inprocess", stream=None)
    evaluated = _rounds(again.out_dir)
    assert [r["ifca_choices"] for r in evaluated] == [r["ifca_choices"] for r in rounds]
    clusters = lambda d: json.loads(open(f"{d}/clusters.json").read())["assignment"]  # noqa: E731
    assert clusters(again.out_dir) == clusters(config.out_dir)


def test_a_newcomer_gets_all_k_models_and_is_placed_by_its_own_choice():
    algorithm = make(strategy_class("ifca"), FOUR, num_clusters=2)
    drive_round(algorithm, 1, lambda ask: trained(ask, 0.0))
    assert "9" not in algorithm.evaluation_models(1, hand(algorithm).active)
    hand(algorithm).clients["9"] = type(hand(algorithm).clients["0"])("9", 50, 1)
    hand(algorithm).active = [*FOUR, "9"]
    (asks,) = drive_round(algorithm, 2, lambda ask: (trained(ask, 0.0), {CHOICE: 0} if ask.key == "9" else {}))
    newcomer = next(a for a in asks if a.key == "9")
    assert newcomer.choices == 2 and algorithm.assignment["9"] == 0  # its choice (the harness default is 1)
    assert algorithm.evaluation_models(2, hand(algorithm).active)["9"][0] == 0


def test_ifca_ending_with_one_chosen_model_says_why():
    from harness import drive_round, make, trained

    from clusterfed.strategies.ifca import IFCA

    algorithm = make(IFCA, {str(i): 0 for i in range(4)}, num_clusters=3)
    drive_round(algorithm, 1, lambda ask: (trained(ask, 0.1), {"ifca-choice": 2}))
    assert set(algorithm.assignment.values()) == {2}
    assert "cluster 2 of 3" in algorithm.final_clusters()["one_cluster_reason"]


# ------------------------------------------- re-seeding a model that wins no client
TWO_GROUPS = {str(i): i % 2 for i in range(6)}


def _everyone_picks_model_0(groups=TWO_GROUPS, noise=0.01, seed=0, shuffled=False):
    """Every client chooses model 0 and moves it along its group's own direction (plus noise);
    ``shuffled``: the groups are redrawn every call of ``respond.next_round`` (no structure that
    holds from one round to the next). Group 1 fits worse (train loss 0.9 against 0.3)."""
    rng = np.random.default_rng(seed)
    directions = {g: rng.normal(0, 1, 64) for g in (0, 1)}

    def respond(ask):
        model = unpack_model(ask.model, 0)
        group = respond.groups[ask.key]
        out = {}
        for i, (name, value) in enumerate(sorted(model.items())):
            pattern = np.resize(directions[group], value.size).reshape(value.shape) + rng.normal(0, noise, value.shape)
            out[name] = (value + 0.1 * pattern).astype(value.dtype)
        return out, {CHOICE: 0}, 0.9 if group else 0.3

    def next_round():
        if shuffled:
            keys = sorted(groups)
            respond.groups = dict(zip(keys, rng.permutation([groups[k] for k in keys]).tolist()))

    respond.groups, respond.next_round = dict(groups), next_round
    return respond


def _drive(algorithm, rounds, respond):
    said = []
    for r in range(1, rounds + 1):
        respond.next_round()
        batches = drive_round(algorithm, r, respond)
        said.append(batches.diagnostics)
    return said


def test_a_model_that_wins_no_client_for_reseed_after_rounds_is_reseeded_from_the_worse_fitting_side():
    """Both groups choose model 0 for two rounds; their updates split the same way in rounds 1
    and 2, so model 1 (idle for reseed-after = 2 rounds) becomes the mean trained model of the
    worse-fitting group, and the round line says so; the group then chooses it."""
    algorithm = make(strategy_class("ifca"), TWO_GROUPS, num_clusters=2, reseed_after=2)
    respond = _everyone_picks_model_0()
    said = _drive(algorithm, 2, respond)
    assert said[0]["decision"].startswith("IFCA compares the training losses of its 2 models on each client's own data")
    assert "ifca_reseed" not in said[0]
    record = said[1]["ifca_reseed"]
    assert record["reseeded"] and record["model"] == 1 and record["cluster"] == 0 and record["agreement"] == 1.0
    assert record["clients"] == ["1", "3", "5"]  # group 1: train loss 0.9 against 0.3
    assert ("model 1 won no client for 2 rounds; re-seeded from cluster 0's 3 worse-fitting clients (mean train "
            "loss 0.9 against 0.3)") in said[1]["decision"]
    assert "rounds 1 and 2 agree (ARI 1.00)" in said[1]["decision"]
    assert algorithm.state.reseeds == [record]
    # the new model 1 is the group-1 clients' mean trained model: it fits them, not group 0
    model1 = algorithm.models[1]
    assert all(np.all(np.isfinite(v)) for v in model1.values())
    assert not all(np.array_equal(model1[n], algorithm.models[0][n]) for n in model1)


def test_the_paper_preset_never_reseeds():
    algorithm = make(strategy_class("ifca"), TWO_GROUPS, num_clusters=2, preset="paper")
    assert algorithm.params.reseed_after == 0
    before = {n: v.copy() for n, v in algorithm.models[1].items()}
    said = _drive(algorithm, 4, _everyone_picks_model_0())
    assert not any("ifca_reseed" in d for d in said)
    assert all(np.array_equal(before[n], algorithm.models[1][n]) for n in before)
    assert algorithm.state.reseeds == []
    reason = algorithm.one_cluster_reason()
    assert "the other models never won a client" in reason and "cluster 0 of 2" in reason
    assert "re-seeding off: reseed-after = 0" in reason


def test_no_reseed_without_a_split_that_holds_from_one_round_to_the_next_and_the_line_says_why():
    """The clients' groups are redrawn every round: no cut of cluster 0 reproduces, model 1
    stays as it was, and the words say why; the last line quotes the same."""
    algorithm = make(strategy_class("ifca"), TWO_GROUPS, num_clusters=2, reseed_after=2)
    before = {n: v.copy() for n, v in algorithm.models[1].items()}
    said = _drive(algorithm, 4, _everyone_picks_model_0(shuffled=True, seed=3))
    checks = [d for d in said if "ifca_reseed" in d]
    assert [d["ifca_reseed"]["reseeded"] for d in checks] == [False, False]  # rounds 2 and 4
    assert "model 1 won no client for 2 rounds; not re-seeded: no cluster's updates split in two the same way" \
        in checks[0]["decision"]
    assert all(np.array_equal(before[n], algorithm.models[1][n]) for n in before)
    reason = algorithm.one_cluster_reason()
    assert "never won a client" in reason and "none did" in reason


def test_the_last_line_does_not_say_never_won_after_a_model_won_clients_earlier():
    """Round 1: clients split over models 0 and 1; from round 2 on all choose model 0. The
    ending names the round model 1 last won a client, not 'never'."""
    from clusterfed.core.contract import ending_sentence

    algorithm = make(strategy_class("ifca"), TWO_GROUPS, num_clusters=2, reseed_after=0)
    drive_round(algorithm, 1, lambda ask: (trained(ask, 0.1), {CHOICE: int(ask.key) % 2}))
    drive_round(algorithm, 2, lambda ask: (trained(ask, 0.1), {CHOICE: 0}))
    ending = ending_sentence(algorithm)
    assert "never" not in ending
    assert "the other models last won a client in round 1" in ending
    assert "re-seeding off: reseed-after = 0" in ending


def test_a_single_client_cluster_is_named_in_the_ending():
    from clusterfed.core.contract import ending_sentence

    algorithm = make(strategy_class("ifca"), TWO_GROUPS, num_clusters=3, reseed_after=0)
    drive_round(algorithm, 1, lambda ask: (trained(ask, 0.1), {CHOICE: 1 if ask.key == "4" else 0}))
    ending = ending_sentence(algorithm)
    assert "IFCA ends with 2 clusters: 2 of the 3 models were each some client's lowest-training-loss model" in ending
    assert "cluster 1 is a single client (4)" in ending
    assert "model(s) 2 won no client at the end" in ending


def test_a_weak_split_of_like_clients_is_no_evidence_even_when_it_repeats():
    """Each client's own data repeats every round, so like clients' cuts can agree from one
    round to the next; a cut whose cosine silhouette is below the bound counts as no split."""
    from clusterfed.clustering.ifca import split_evidence

    rng = np.random.default_rng(0)
    common = rng.normal(0, 1, 50)
    own = {str(k): rng.normal(0, 0.3, 50) for k in range(6)}  # each client's lasting idiosyncrasy
    rows = lambda: {k: (0, common + own[k] + rng.normal(0, 0.01, 50), None) for k in own}  # noqa: E731
    now, before = rows(), rows()
    cluster, evidence, keys = split_evidence(now, {k: (c, x) for k, (c, x, _) in before.items()}, 2)
    assert evidence.agreement == 0.0  # the cut repeats (same labels) but counts for nothing
    assert list(evidence.labels_a) == list(evidence.labels_b)
    groups = {k: (0, (1 if int(k) % 2 else -1) * common + own[k], None) for k in own}  # two real groups
    _, evidence, _ = split_evidence(groups, {k: (c, x) for k, (c, x, _) in groups.items()}, 2)
    assert evidence.agreement == 1.0
