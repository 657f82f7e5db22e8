"""What counts as an update on real architectures (not clusterfed's own CNNs): which arrays
are compared, which layers each rule picks, how every dtype and shape travels and how
buffers are aggregated. The models are small stock torch modules built here."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict
from harness import hand, round_of
from torch import nn

from clusterfed import protocol
from clusterfed.models import compared_names, select_layers, trainable_names
from clusterfed.runner.validation import parse_train_reply
from clusterfed.strategies.base import StrategyParamsError
from clusterfed.strategies.cfl import CFL
from clusterfed.core.exchange import Ask, ClientInfo, TrainReply, weighted_average
from clusterfed.training import state_to_numpy


class Block(nn.Module):
    """A ResNet basic block with a projection shortcut."""

    def __init__(self, cin, cout):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.downsample(x))


class ResNetBN(nn.Module):
    """Stem, one residual stage, a linear head and a trailing BatchNorm1d on the logits."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.layer1 = nn.Sequential(Block(4, 6))
        self.fc = nn.Linear(6, 3)
        self.bn_out = nn.BatchNorm1d(3)

    def forward(self, x):
        x = self.layer1(torch.relu(self.bn1(self.conv1(x))))
        return self.bn_out(self.fc(x.mean(dim=(2, 3))))


class RecurrentClassifier(nn.Module):
    """A Conv1d front, a 2-layer GRU or LSTM, a LayerNorm and two linear layers."""

    def __init__(self, cell=nn.GRU):
        super().__init__()
        self.front = nn.Conv1d(4, 8, 3, padding=1)
        self.rnn = cell(8, 8, num_layers=2, batch_first=True)
        self.norm = nn.LayerNorm(8)
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        out, _ = self.rnn(self.front(x).transpose(1, 2))
        return self.fc2(torch.relu(self.fc1(self.norm(out[:, -1]))))


class TinyTransformer(nn.Module):
    """Token embedding, one encoder layer (MultiheadAttention, LayerNorm), GroupNorm-free head;
    a bool mask buffer and a sinusoidal position buffer."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(20, 8)
        self.register_buffer("pe", torch.sin(torch.arange(40, dtype=torch.float32).reshape(5, 8)))
        self.register_buffer("causal_mask", torch.ones(5, 5, dtype=torch.bool).triu(1))
        self.encoder = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 4)

    def forward(self, tokens):
        x = self.embedding(tokens) + self.pe[: tokens.shape[1]]
        return self.head(self.norm(self.encoder(x)).mean(dim=1))


class ScalarBuffer(nn.Module):
    """A GroupNorm'd MLP with a 0-d float buffer (a temperature) and an int32 step counter."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.gn = nn.GroupNorm(2, 8)
        self.fc2 = nn.Linear(8, 2)
        self.register_buffer("temperature", torch.tensor(1.5))
        self.register_buffer("steps", torch.tensor([7], dtype=torch.int32))

    def forward(self, x):
        return self.fc2(torch.relu(self.gn(self.fc1(x)))) / self.temperature


class TiedLM(nn.Module):
    """An embedding and a decoder sharing one weight."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(12, 6)
        self.proj = nn.Linear(6, 6)
        self.decoder = nn.Linear(6, 12, bias=False)
        self.decoder.weight = self.embed.weight


def half_mlp():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).half()


MODELS = {
    "resnet-bn": ResNetBN,
    "gru": RecurrentClassifier,
    "lstm": lambda: RecurrentClassifier(nn.LSTM),
    "transformer": TinyTransformer,
    "scalar-buffer": ScalarBuffer,
    "float16": half_mlp,
}


def numpy_state(model):
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_compared_arrays_are_the_trainable_parameters_and_exclude_exactly_the_buffers(name):
    torch.manual_seed(0)
    model = MODELS[name]()
    state = numpy_state(model)
    compared = compared_names(state)
    assert compared == trainable_names(model)
    assert set(state) - set(compared) == {n for n, _ in model.named_buffers()}


def test_tied_weights_are_one_trainable_name_and_the_default_keeps_both_state_dict_entries():
    model = TiedLM()
    state = numpy_state(model)
    assert trainable_names(model) == ["embed.weight", "proj.weight", "proj.bias"]
    assert compared_names(state) == list(state)  # the decoder's entry too: a state dict cannot tell
    assert compared_names(state, trainable_names(model)) == trainable_names(model)


def test_compare_arrays_overrides_by_pattern_names_and_predicate():
    state = numpy_state(ResNetBN())
    assert compared_names(state, r"^fc\.") == ["fc.weight", "fc.bias"]
    assert compared_names(state, ["fc.bias", "conv1.weight"]) == ["conv1.weight", "fc.bias"]  # state-dict order
    # the pattern picks among floating-point arrays: a counter never enters a distance
    assert "bn1.num_batches_tracked" not in compared_names(state, "bn1")
    assert compared_names(state, lambda n, a: n.endswith("running_mean")) == [
        n for n in state if n.endswith("running_mean")]
    with pytest.raises(ValueError, match="not floating-point.*bn1.num_batches_tracked"):
        compared_names(state, ["bn1.num_batches_tracked"])
    with pytest.raises(ValueError, match="does not have.*nope"):
        compared_names(state, ["nope"])
    with pytest.raises(ValueError, match="no array of the model is compared"):
        compared_names(state, "^zzz")
    with pytest.raises(StrategyParamsError, match="compare_arrays.*not a regular expression"):
        CFL(compare_arrays="fc(")


# rule -> expected keys, per model; None: the rule has no layer to pick (ValueError)
EXPECTED_LAYERS = {
    "resnet-bn": {
        "final": ["fc.weight", "fc.bias"],  # not the trailing bn_out
        "fc": ["fc.weight", "fc.bias"],
        "smallest-fc": ["fc.weight", "fc.bias"],
        "conv": ["layer1.0.downsample.0.weight"],  # the last conv registered
        "layer1.0.conv2,bn1": ["bn1.weight", "bn1.bias", "layer1.0.conv2.weight"],  # never bn1's buffers
    },
    "gru": {
        "final": ["fc2.weight", "fc2.bias"],
        "fc": ["fc1.weight", "fc1.bias"],  # the GRU's weight_ih_l0 is not a linear layer
        "smallest-fc": ["fc2.weight", "fc2.bias"],
        "conv": ["front.weight", "front.bias"],  # Conv1d: a 3-D weight
    },
    "transformer": {
        "final": ["head.weight", "head.bias"],
        # the embedding is not fc; the attention's out_proj is the first linear layer
        "fc": ["encoder.self_attn.out_proj.weight", "encoder.self_attn.out_proj.bias"],
        "smallest-fc": ["head.weight", "head.bias"],
        "conv": None,
        "encoder.self_attn": ["encoder.self_attn.in_proj_weight", "encoder.self_attn.in_proj_bias"],
    },
    "scalar-buffer": {
        "final": ["fc2.weight", "fc2.bias"],
        "fc": ["fc1.weight", "fc1.bias"],
        "smallest-fc": ["fc2.weight", "fc2.bias"],
        "conv": None,
    },
    "float16": {"final": ["2.weight", "2.bias"], "fc": ["0.weight", "0.bias"], "conv": None},
}
EXPECTED_LAYERS["lstm"] = EXPECTED_LAYERS["gru"]


@pytest.mark.parametrize("name,rule", [(m, r) for m, rules in EXPECTED_LAYERS.items() for r in rules])
def test_select_layers_picks_the_right_keys_on_a_state_dict_and_on_the_module(name, rule):
    torch.manual_seed(0)
    model = MODELS[name]()
    expected = EXPECTED_LAYERS[name][rule]
    for given in (numpy_state(model), model):
        if expected is None:
            with pytest.raises(ValueError, match=f"rule '{rule}'"):
                select_layers(given, rule)
        else:
            assert select_layers(given, rule) == expected


def test_select_layers_all_is_every_compared_array_and_a_recurrent_layer_is_one_layer():
    model = RecurrentClassifier(nn.LSTM)
    state = numpy_state(model)
    assert select_layers(state, "all") == trainable_names(model)
    assert select_layers(state, "rnn") == [n for n in state if n.startswith("rnn.")]
    with pytest.raises(ValueError, match="not compared"):
        select_layers(numpy_state(ResNetBN()), "bn1.running_mean")


def test_tied_decoder_is_final_on_the_state_dict_and_the_embedding_is_not_fc():
    model = TiedLM()
    assert select_layers(numpy_state(model), "final") == ["decoder.weight"]
    assert select_layers(numpy_state(model), "fc") == ["proj.weight", "proj.bias"]
    # given the module, the tied decoder is the embedding's weight: proj is the last layer of its own
    assert select_layers(model, "final") == ["proj.weight", "proj.bias"]


@pytest.mark.parametrize("name", sorted(MODELS) + ["tied"])
def test_every_state_dict_round_trips_dtype_and_shape_through_the_protocol(name):
    model = TiedLM() if name == "tied" else MODELS[name]()
    state = numpy_state(model)
    state["extra.int64"] = np.arange(3, dtype=np.int64)
    state["extra.scalar_f64"] = np.array(2.5)
    state["extra.scalar_bool"] = np.array(True)
    for via_flower in (False, True):
        record = ArrayRecord({k: Array(v) for k, v in state.items()}) if via_flower else protocol.to_array_record(state)
        back = protocol.from_array_record(record)
        assert list(back) == list(state)
        for key, value in state.items():
            assert back[key].dtype == value.dtype and back[key].shape == value.shape, key
            np.testing.assert_array_equal(back[key], value)
        # and again, as a client sends back what it was sent
        again = protocol.from_array_record(protocol.to_array_record(back))
        assert {k: (v.dtype, v.shape) for k, v in again.items()} == {k: (v.dtype, v.shape) for k, v in state.items()}


def test_a_torch_state_dict_with_a_0d_buffer_keeps_shape_in_flowers_record_and_ours():
    model = ScalarBuffer()
    arrays = protocol.from_array_record(ArrayRecord(model.state_dict()))
    assert arrays["temperature"].shape == () and arrays["steps"].dtype == np.int32
    assert protocol.to_array_record(arrays)["temperature"].shape == ()


def test_bfloat16_gets_a_clear_message():
    model = nn.Linear(2, 2).to(torch.bfloat16)
    with pytest.raises(TypeError, match="unsupported ScalarType BFloat16"):
        ArrayRecord(model.state_dict())  # Flower's own conversion
    with pytest.raises(TypeError, match=r"weight, bias are bfloat16.*float32"):
        state_to_numpy(model)


def test_weighted_average_keeps_every_dtype_and_aggregates_buffers_by_their_rule():
    models = [
        {"w": np.full((2,), v, np.float16), "t": np.array(v, np.float64), "count": np.array(c, np.int64),
         "flags": np.array([b, not b, True]), "steps": np.array([c], np.int32)}
        for v, c, b in ((1.0, 10, True), (2.0, 20, False), (4.0, 31, False))
    ]
    out = weighted_average(models, [1, 1, 2])
    for name, value in models[0].items():
        assert out[name].dtype == value.dtype and out[name].shape == value.shape, name
        assert isinstance(out[name], np.ndarray), name
    np.testing.assert_array_equal(out["w"], np.full((2,), 2.75, np.float16))
    assert out["t"] == 2.75
    assert out["count"] == 23  # (10 + 20 + 2·31) / 4 = 23.0
    assert out["steps"][0] == 23
    np.testing.assert_array_equal(out["flags"], [False, True, True])  # weighted majority: 1 of 4 true, 3 of 4
    # rounding halves to even: (10 + 11) / 2 = 10.5 -> 10
    assert weighted_average([{"c": np.array(10)}, {"c": np.array(11)}], [1, 1])["c"] == 10
    # a tie of a bool: True
    assert weighted_average([{"b": np.array(True)}, {"b": np.array(False)}], [1, 1])["b"]


def test_updates_of_integer_and_bool_buffers_restore_the_trained_values_exactly():
    sent = {"count": np.array(5, np.int64), "mask": np.array([True, False]), "u8": np.array([250], np.uint8),
            "t": np.array(1.5, np.float32)}
    trained = {"count": np.array(9, np.int64), "mask": np.array([False, False]), "u8": np.array([3], np.uint8),
               "t": np.array(0.5, np.float32)}
    update = {k: protocol.difference(trained[k], sent[k]) for k in sent}
    reply = TrainReply("0", 0, update, sent, 1, 0.0, {}, is_update=True)
    for key, value in reply.weights.items():
        assert value.dtype == trained[key].dtype and value.shape == trained[key].shape
        np.testing.assert_array_equal(value, trained[key])
    plain = TrainReply("0", 0, trained, sent, 1, 0.0, {})
    assert plain.update["mask"].tolist() == [True, False] and plain.update["t"].shape == ()


def test_a_reply_that_sends_back_a_received_0d_array_is_accepted():
    model = {k: v for k, v in numpy_state(ScalarBuffer()).items()}
    shapes = {k: (tuple(v.shape), v.dtype) for k, v in model.items()}
    received = protocol.from_array_record(protocol.to_array_record(model))  # what the client decodes
    content = RecordDict({
        protocol.ARRAYS: protocol.to_array_record(received),
        protocol.METRICS: MetricRecord({"num-examples": 5, "train-loss": 0.1}),
    })
    ask = Ask("0", model, {"cluster-id": 0, "upload": "full", "return": "weights"})
    reply = parse_train_reply(content, ask, shapes)
    assert reply.arrays["temperature"].shape == () and reply.arrays["steps"].dtype == np.int32


# ---------------------------------------------------------------- CFL on a BatchNorm model
GROUP = {str(i): i % 2 for i in range(8)}


def bn_updates(seed, counters):
    """Per client a ResNetBN update: weights pulled by the client's group plus noise; the
    BatchNorm running statistics noisy and large, the counters given (by client)."""
    rng = np.random.default_rng(seed)
    theta0 = numpy_state(ResNetBN())
    compared = compared_names(theta0)
    direction = {g: {n: rng.standard_normal(theta0[n].shape) for n in compared} for g in (0, 1)}
    updates = {}
    for key, group in GROUP.items():
        update = {}
        for name, value in theta0.items():
            if name in compared:
                update[name] = (0.01 * direction[group][name] + 0.002 * rng.standard_normal(value.shape))
            elif name.endswith("num_batches_tracked"):
                update[name] = np.array(counters[int(key)], np.int64)
            else:  # running statistics: large, and unrelated to the groups
                update[name] = 0.5 * rng.standard_normal(value.shape)
            update[name] = update[name].astype(value.dtype)
        updates[key] = update
    return theta0, updates


def bn_cfl(theta0, **params):
    """CFL with the split criteria always met, its 8 clients admitted to the root."""
    strategy = CFL(split_criteria="absolute", eps1=1e6, eps2=1e-6, min_split_round=1, split_min_silhouette=-1,
                   merge=False, **params)
    hand(strategy).train_config = {"lr": 0.05}
    strategy.init(theta0, hand(strategy).train_config)
    for key, group in GROUP.items():
        hand(strategy).clients[key] = ClientInfo(key, 50, group)
    hand(strategy).active = list(GROUP)
    assert list(strategy.admit(round_of(strategy, 1), list(GROUP))) == []  # before any split, placement asks nothing
    return strategy


def bn_replies(strategy, updates):
    return [TrainReply(key=k, cluster=strategy.assignment[k], arrays=u, sent=strategy.models[strategy.assignment[k]],
                       num_examples=50, train_loss=0.0, metrics={}, is_update=True) for k, u in updates.items()]


def split_sides(strategy):
    return {frozenset(members) for members in strategy.state.splits[0]["members"]} if strategy.state.splits else set()


def cfl_after_one_round(theta0, updates, **params):
    """One round of Sattler's Algorithm 1: the paper's timing (split-timing = criteria) splits in
    the round the criteria hold; on evidence (the default) no split can come before a second round."""
    strategy = bn_cfl(theta0, split_timing="criteria", **params)
    replies = bn_replies(strategy, updates)
    decision = strategy.bipartition.criteria(strategy.state, 0, replies)
    strategy.after_train(round_of(strategy, 1), replies)
    return decision, split_sides(strategy)


def test_cfl_splits_a_batchnorm_model_by_its_groups_whatever_the_counters_say():
    truth = {frozenset(k for k, g in GROUP.items() if g == side) for side in (0, 1)}
    counters = [72, 72, 9, 9, 72, 9, 72, 9]  # unrelated to the groups (keys 0..7 alternate groups)
    theta0, updates = bn_updates(0, counters)
    decision, sides = cfl_after_one_round(theta0, updates)
    assert sides == truth
    # the same updates with equal counters: the same decision, to the last digit
    _, equal = bn_updates(0, [72] * 8)
    decision_equal, sides_equal = cfl_after_one_round(theta0, equal)
    assert sides_equal == truth
    assert (decision.mean_norm, decision.max_norm) == (decision_equal.mean_norm, decision_equal.max_norm)
    # comparing every array, as before, the buffers decide the split: the wrong one
    _, sides_all = cfl_after_one_round(theta0, updates, compare_arrays=lambda name, array: True)
    assert sides_all and sides_all != truth


def test_cfl_on_evidence_splits_a_batchnorm_model_by_its_groups_when_two_rounds_agree():
    """The timing on evidence: round 1's partition is kept, round 2's (fresh updates, the same
    unrelated counters) agrees with it, and the split is the groups'."""
    truth = {frozenset(k for k, g in GROUP.items() if g == side) for side in (0, 1)}
    counters = [72, 72, 9, 9, 72, 9, 72, 9]
    theta0, _ = bn_updates(0, counters)
    strategy = bn_cfl(theta0, split_timing="evidence")
    for server_round in (1, 2):
        updates = bn_updates(server_round, counters)[1]
        strategy.after_train(round_of(strategy, server_round), bn_replies(strategy, updates))
        if server_round == 1:
            assert split_sides(strategy) == set()  # nothing to compare yet: deferred
    assert split_sides(strategy) == truth and strategy.state.splits[0]["round"] == 2


# ---------------------------------------------------------------- a stock ClientApp, end to end
class BatchNormNet(nn.Module):
    """The user app's MLP with a BatchNorm layer and a 0-d buffer."""

    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(4, 16)
        self.bn = nn.BatchNorm1d(16)
        self.out = nn.Linear(16, 2)
        self.register_buffer("temperature", torch.tensor(1.0))

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.hidden(x)))) / self.temperature


def test_cfl_on_a_stock_batchnorm_client_recovers_the_groups_and_keeps_the_buffers_dtypes(monkeypatch):
    """The user app's stock ClientApp (two label-swapped groups), its model swapped for BatchNormNet."""
    from flwr.app import ConfigRecord
    from flwr.supercore.task_identity import TaskIdentity
    from sklearn.metrics import adjusted_rand_score
    from userapp import client_app as stock
    from userapp.task import group_of

    from clusterfed.runner.inprocess import InProcessGrid
    from clusterfed.training import cap_threads

    cap_threads()  # torch's default thread pool spins on tiny BatchNorm batches
    clients = 8
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    monkeypatch.setattr(stock, "Net", BatchNormNet)
    grid = InProcessGrid(stock.app, clients, node_configs=[{"partition-id": i} for i in range(clients)])
    torch.manual_seed(0)
    initial = BatchNormNet().state_dict()
    result = CFL(fraction_evaluate=0.0).start(grid=grid, initial_arrays=ArrayRecord(initial), num_rounds=6,
                                              train_config=ConfigRecord({"lr": 0.1, "local-epochs": 1}))
    keys = sorted(result.assignment)
    groups = [group_of(int(k.removeprefix("node-")) - 1000) for k in keys]
    assert adjusted_rand_score(groups, [result.assignment[k] for k in keys]) == 1.0, \
        result.clustering.get("one_cluster_reason")
    for record in result.cluster_arrays.values():
        arrays = protocol.from_array_record(record)
        assert {k: (v.shape, v.dtype) for k, v in arrays.items()} == {
            k: (tuple(v.shape), v.numpy().dtype) for k, v in initial.items()}
        # every client ran 6 rounds of 5 batches: the cluster's counter is their mean, 30
        assert int(arrays["bn.num_batches_tracked"]) == 30


def test_a_checkpoint_keeps_0d_arrays_and_every_dtype(tmp_path):
    from clusterfed.runner.checkpoint import load_checkpoint, save_checkpoint

    model = numpy_state(ScalarBuffer())
    model.update({"mask": np.array([True, False]), "count": np.array(7, np.int64), "half": np.ones(2, np.float16)})
    save_checkpoint(tmp_path, {"round": 1, "models": {0: model}})
    back = load_checkpoint(tmp_path)["models"][0]
    assert {k: (v.dtype, v.shape) for k, v in back.items()} == {k: (v.dtype, v.shape) for k, v in model.items()}


class MaskedBatchNormNet(BatchNormNet):
    """BatchNormNet with a bool buffer as well."""

    def __init__(self):
        super().__init__()
        self.register_buffer("keep", torch.tensor([True, False, True]))


def test_the_client_helper_returns_buffers_and_0d_arrays_in_their_dtypes_and_the_server_accepts_them():
    from flwr.app import ConfigRecord, Context, Message
    from flwr.common import MessageType
    from flwr.supercore.task_identity import TaskIdentity
    from torch.utils.data import DataLoader, TensorDataset

    from clusterfed.client import ClientTask, TaskData, client_app

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    task = ClientTask(model_fn=lambda context, config: MaskedBatchNormNet(),
                      data_fn=lambda context, config: TaskData(loader, loader))
    torch.manual_seed(0)
    sent = numpy_state(MaskedBatchNormNet())
    shapes = {k: (v.shape, v.dtype) for k, v in sent.items()}
    for returned in ("weights", "update"):
        config = {"server-round": 1, "phase": "train", "local-epochs": 1, "lr": 0.1, "cluster-id": 0,
                  "upload": "full", "return": returned}
        content = RecordDict({protocol.CONFIG: ConfigRecord(config), protocol.ARRAYS: protocol.to_array_record(sent)})
        message = Message(content, dst_node_id=7, message_type=MessageType.TRAIN)
        message.metadata.__dict__["_message_id"] = "m1"
        context = Context(run_id=1, node_id=7, node_config={"partition-id": 0}, state=RecordDict(), run_config={})
        reply_content = client_app(task)(message, context).content
        reply = parse_train_reply(reply_content, Ask("0", sent, config), shapes)
        weights = reply.weights
        assert {k: (v.shape, v.dtype) for k, v in weights.items()} == shapes
        assert int(weights["bn.num_batches_tracked"]) == 4  # 32 examples in batches of 8
        assert weights["temperature"] == 1.0 and weights["keep"].tolist() == [True, False, True]
