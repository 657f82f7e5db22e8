"""clusterfed as a library: a Flower user's own app (own model, own data, stock ClientApp)
swaps FedAvg for a clustered strategy in one line; strategies from outside the package;
what each strategy module may and may not touch."""

from __future__ import annotations

import ast
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord
from flwr.supercore.task_identity import TaskIdentity
from sklearn.metrics import adjusted_rand_score
from userapp.client_app import app as stock_client_app
from userapp.task import Net, group_of

import clusterfed
from clusterfed.runner.inprocess import InProcessGrid
from clusterfed.strategies import REGISTRY, clustered_classes
from clusterfed.strategies.base import StrategyParamsError

ROOT = Path(__file__).resolve().parent.parent
NUM_CLIENTS = 8


def run_user_app(strategy, rounds: int, client_app=stock_client_app, num_clients: int = NUM_CLIENTS):
    """What a user's ServerApp does: ``strategy.start(grid=..., initial_arrays=..., num_rounds=...)``."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    grid = InProcessGrid(client_app, num_clients, node_configs=[{"partition-id": i} for i in range(num_clients)])
    torch.manual_seed(0)
    return strategy.start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()), num_rounds=rounds,
                          train_config=ConfigRecord({"lr": 0.1, "local-epochs": 1}))


def ari(result) -> float:
    keys = sorted(result.assignment)
    groups = [group_of(int(k.removeprefix("node-")) - 1000) for k in keys]
    return adjusted_rand_score(groups, [result.assignment[k] for k in keys])


@pytest.mark.parametrize("name, rounds", [("FedClust", 3), ("CFL", 12), ("LayerCFL", 12), ("HiCFL", 20)])
@pytest.mark.end_to_end
def test_one_line_swap_recovers_the_groups_with_a_stock_client_app(name, rounds):
    result = run_user_app(getattr(clusterfed, name)(), rounds)
    assert ari(result) == 1.0, result.clustering.get("one_cluster_reason")
    assert len(result.cluster_arrays) >= 2 and set(result.arrays) == set(Net().state_dict())
    last = result.evaluate_metrics_clientapp[rounds]
    assert last["num-examples"] == NUM_CLIENTS * 24 and last["eval_acc"] > 0.8


@pytest.mark.parametrize("name", ["FedAvg", "FedProx"])
def test_fedavg_and_fedprox_run_a_stock_client_app(name):
    result = run_user_app(getattr(clusterfed, name)(), 3)
    assert len(set(result.assignment.values())) == 1 and set(result.assignment) == {
        f"node-{1000 + i}" for i in range(NUM_CLIENTS)}
    # Flower's way: the clients' metrics averaged by num-examples, per round
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    assert result.train_metrics_clientapp[1]["num-examples"] == NUM_CLIENTS * 72
    assert "train_loss" in result.train_metrics_clientapp[1]


# AdaCFL asks for label statistics but takes a stock client (tests/test_oneshot_reproducible.py)
@pytest.mark.parametrize("strategy, capability", [("IFCA", "choosing the lowest-training-loss model")])
def test_a_strategy_needing_more_than_a_stock_client_stops_before_round_1(strategy, capability, caplog):
    with pytest.raises(clusterfed.CapabilityError, match=capability) as error:
        run_user_app(getattr(clusterfed, strategy)(), 2)
    assert "node-1000" in str(error.value) and "clusterfed.client" in str(error.value)
    assert not isinstance(error.value, StrategyParamsError)  # no parameter is wrong
    # refused after the profile probe, before any train message, and with nothing logged per node
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_adacfl_without_label_statistics_runs_on_stock_clients():
    result = run_user_app(clusterfed.AdaCFL(share_label_stats=False, warmup_rounds=0), 2)
    assert result.clustering["preclustering"] is False


def test_constructor_parameters_are_typed_and_checked():
    assert clusterfed.FedClust(lambda_=0.5).params.lambda_ == 0.5
    assert clusterfed.FedClust().params.lambda_ == "auto"
    with pytest.raises(StrategyParamsError, match=r"'fedclust' has no parameter 'eps1' \(cfl, layercfl, hicfl have it\)"):
        clusterfed.FedClust(eps1=0.2)
    with pytest.raises(StrategyParamsError, match="lambda_ = 'soon'.*should be 'auto'"):
        clusterfed.FedClust(lambda_="soon")
    with pytest.raises(StrategyParamsError, match="did you mean 'lambda_'"):
        clusterfed.FedClust(lamda_=0.5)
    with pytest.raises(StrategyParamsError, match="does not take Flower's 'weighted_by_key'"):
        clusterfed.FedClust(weighted_by_key="num-examples")
    assert clusterfed.CFL(min_train_nodes=3, min_evaluate_nodes=2).params.min_train_nodes == 3
    with pytest.raises(StrategyParamsError, match="fraction_train"):
        clusterfed.CFL(fraction_train=2.0)


def test_every_public_strategy_is_a_flower_strategy_without_unimplemented_methods():
    from flwr.serverapp.strategy import Strategy

    for name in ("FedAvg", "FedProx", "FedClust", "AdaCFL", "CFL", "LayerCFL", "HiCFL", "IFCA", "ClientSelection"):
        cls = getattr(clusterfed, name)
        assert issubclass(cls, Strategy) and not cls.__abstractmethods__
    for path in (ROOT / "clusterfed" / "strategies").glob("*.py"):
        assert "NotImplementedError" not in path.read_text(), path.name


def test_a_strategy_from_outside_the_package_runs_by_module_and_class(tmp_path):
    from clusterfed.config import ConfigError, parse_config
    from clusterfed.simulation import simulate

    config = parse_config({"strategy": "userapp.my_strategy:Halves", "halves.halves": 3, "num-clients": 6,
                           "rounds": 2, "out-dir": str(tmp_path), "batch-size": 32})
    summary = simulate(config, engine="inprocess", stream=None)
    assert summary["num_clusters"] == 3
    with pytest.raises(ConfigError, match="halves.halves"):
        parse_config({"strategy": "userapp.my_strategy:Halves", "halves.halves": 0})
    with pytest.raises(ConfigError, match="has no 'Nope'"):
        parse_config({"strategy": "userapp.my_strategy:Nope"})
    with pytest.raises(ConfigError, match="cannot be imported"):
        parse_config({"strategy": "no_such_package.module:Cls"})


@pytest.mark.end_to_end
def test_bad_strategy_input_is_one_line_and_exit_2():
    for setting in ("strategy=no_such.module:X", "fedclust.eps1=0.3", "fedclust.lambda=-1"):
        result = subprocess.run([sys.executable, "-m", "clusterfed.cli", "run", "--engine", "inprocess",
                                 "--set", "strategy=fedclust", "--set", setting], capture_output=True, text=True)
        assert result.returncode == 2, setting
        assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("clusterfed:"), result.stderr


# ---------------------------------------------------------------- the shape of the code
STRATEGY_DIR = ROOT / "clusterfed" / "strategies"
FLOWER_NAMES = {"Message", "Grid", "send_and_receive", "push_messages", "pull_messages"}


def test_no_strategy_module_but_the_flower_hooks_touches_messages_or_the_grid():
    for path in STRATEGY_DIR.glob("*.py"):
        if path.name in ("flower_hooks.py", "__init__.py"):  # the base's Flower face hands all to the driver
            continue
        names = {node.id for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Name)}
        names |= {node.attr for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Attribute)}
        assert not names & FLOWER_NAMES, (path.name, names & FLOWER_NAMES)


def mentions_of_true_groups(tree: ast.AST) -> list[str]:
    """Every name, attribute, argument, import or string in ``tree`` that speaks of true
    groups, except the declaration of ``ClientInfo``'s field (an annotated name in a class)."""
    declared = {id(node.target) for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef)
                for node in cls.body if isinstance(node, ast.AnnAssign)}
    found = []
    for node in ast.walk(tree):
        text = (node.id if isinstance(node, ast.Name) and id(node) not in declared else
                node.attr if isinstance(node, ast.Attribute) else
                node.arg if isinstance(node, (ast.arg, ast.keyword)) else
                node.name if isinstance(node, ast.alias) else
                node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None)
        if text and "true_group" in text:
            found.append(text)
    return found


def test_no_strategy_but_the_oracle_reads_true_groups():
    """Ground truth is for metrics only: the driver's scoring compares a strategy's splits,
    placements and assignment with the true groups; only the oracle baseline clusters on them."""
    assert mentions_of_true_groups(ast.parse("x = info.true_group\nrecord['true_group_gap'] = 1"))  # the test sees them
    found = {path.name: hits for path in STRATEGY_DIR.glob("*.py") if path.name != "oracle.py"
             if (hits := mentions_of_true_groups(ast.parse(path.read_text())))}
    assert not found


def test_no_strategy_module_keeps_time():
    """The driver times the strategy's steps (``clustering_seconds``): no strategy reads a clock."""
    found = []
    for path in STRATEGY_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "time" for a in node.names):
                found.append(path.name)
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "time":
                found.append(path.name)
    assert not found


def test_no_strategy_name_in_shared_code():
    names = [n for n in REGISTRY if n != "flwr-fedavg"]
    shared = [ROOT / "clusterfed" / d for d in ("clustering", "plots", "client", "runner", "experiments")]
    shared += [ROOT / "clusterfed" / f for f in ("client_app.py", "results.py", "compare.py", "protocol.py")]
    found = []
    for place in shared:
        for path in ([place] if place.is_file() else place.rglob("*.py")):
            if not path.exists() or path.name == "flwr_fedavg.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and node.value in names:
                    found.append((path.name, node.value))
    assert not found


def test_generated_configuration_reference_matches_the_schemas():
    from clusterfed import reference

    assert (ROOT / "docs" / "configuration.md").read_text() == reference.markdown()
    assert reference.pyproject_section() in (ROOT / "pyproject.toml").read_text()


def test_every_registered_strategy_declares_its_params_and_state():
    import dataclasses

    for name, cls in clustered_classes().items():
        assert cls.name == name and dataclasses.is_dataclass(cls.State)
        strategy = cls()
        assert isinstance(strategy.state, cls.State)
        field = dataclasses.fields(cls.State)[-1].name
        with pytest.raises(AttributeError, match=f"write it as self.state.{field}"):
            setattr(strategy, field, None)


def test_flat_keys_still_work_and_equal_the_namespaced_ones():
    from clusterfed import strategy_config
    from clusterfed.config import parse_config

    strategy_config._SAID.clear()
    flat = parse_config({"strategy": "hicfl", "hicfl-timing": "all", "eps1": 0.2, "window": 3})
    namespaced = parse_config({"strategy": "hicfl", "hicfl.timing": "all", "hicfl.eps1": 0.2, "hicfl.window": 3})
    assert flat == namespaced and flat.strategy_params["timing"] == "all"
    assert "config key 'hicfl-timing' is deprecated: use hicfl.timing" in strategy_config._SAID
    # the run config a checkpoint and config.json record carries the namespaced keys
    assert flat.to_flower()["hicfl.window"] == 3 and "window" not in flat.to_flower()


def test_a_declared_metric_where_lower_is_better_drives_the_records(tmp_path):
    import json

    from clusterfed.results import Metric, RunRecorder
    from clusterfed.runner.driver import RunOptions

    strategy = clusterfed.FedClust()
    recorder = RunRecorder(tmp_path, {"rounds": 4}, stream=None, metric=Metric("eval_loss", higher_is_better=False),
                           target=0.45)
    strategy.run_options = RunOptions(recorder=recorder)
    run_user_app(strategy, 4)
    summary = recorder.finish(0.0, strategy.final_clusters())
    rows = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    losses = [r["eval_loss"] for r in rows]
    assert summary["metric"] == "eval_loss" and summary["best_eval_loss"] == min(losses)
    reached = next(r["round"] for r in rows if r["eval_loss"] <= 0.45)
    assert summary["rounds_to_target"] == reached
    assert set(rows[-1]["client_eval_loss"]) == {f"node-{1000 + i}" for i in range(NUM_CLIENTS)}


def test_flowers_single_phase_hooks_train_and_evaluate_each_cluster():
    """configure_train / aggregate_train / configure_evaluate / aggregate_evaluate work as
    Flower's loop would call them (no clustering phases: the one-cluster step)."""
    from clusterfed import protocol

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    grid = InProcessGrid(stock_client_app, 4, node_configs=[{"partition-id": i} for i in range(4)])
    strategy = clusterfed.FedAvg()
    torch.manual_seed(0)
    theta0 = protocol.from_array_record(ArrayRecord(Net().state_dict()))
    strategy.init(theta0)
    messages = list(strategy.configure_train(1, ArrayRecord(), ConfigRecord({"lr": 0.1}), grid))
    assert len(messages) == 4 and all("lr" in m.content["config"] for m in messages)
    model_bytes = sum(v.nbytes for v in theta0.values())
    assert strategy.driver.link.traffic.down == 4 * model_bytes  # built and counted as start() does
    arrays, metrics = strategy.aggregate_train(1, grid.send_and_receive(messages))
    assert metrics["num-examples"] == 4 * 72 and set(arrays) == set(theta0)
    assert any(not (arrays[n].numpy() == theta0[n]).all() for n in theta0)  # the model moved
    evaluated = strategy.aggregate_evaluate(1, grid.send_and_receive(
        strategy.configure_evaluate(1, arrays, ConfigRecord({}), grid)))
    assert evaluated["num-examples"] == 4 * 24 and 0 <= evaluated["eval_acc"] <= 1


def test_single_phase_hooks_stop_loudly_when_placing_clients_asks_them_for_work():
    """FedClust places clients by a clustering round, which one exchange per round cannot
    hold: configure_train says so and names start(), instead of training nobody."""
    from clusterfed import protocol

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    grid = InProcessGrid(stock_client_app, 4, node_configs=[{"partition-id": i} for i in range(4)])
    strategy = clusterfed.FedClust()
    strategy.init(protocol.from_array_record(ArrayRecord(Net().state_dict())))
    with pytest.raises(StrategyParamsError, match=r"first asks 4 client\(s\) for cluster work.*strategy\.start"):
        strategy.configure_train(1, ArrayRecord(), ConfigRecord({}), grid)
    assert not strategy.assignment  # nobody half-placed


def test_a_strategy_from_an_installed_entry_point_runs_by_name(monkeypatch):
    from importlib.metadata import EntryPoint

    import clusterfed.strategies.registry as registry
    from clusterfed.config import parse_config

    point = EntryPoint(name="halves", value="userapp.my_strategy:Halves", group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [point] if group == registry.ENTRY_POINT_GROUP else [])
    config = parse_config({"strategy": "halves", "halves.halves": 4})
    assert type(config.build_strategy()).__name__ == "Halves" and config.strategy_params == {"halves": 4}
    assert "halves" in registry.strategy_names()


def test_a_one_shot_strategy_that_ends_as_fedavg_says_why():
    # the fixed threshold alone (no group-free reference, which would let the real groups through)
    result = run_user_app(clusterfed.FedClust(auto_min_silhouette=0.99, auto_reference_draws=0), 2)
    assert len(result.cluster_arrays) == 1
    reason = result.clustering["one_cluster_reason"]
    assert "silhouette" in reason and "0.99" in reason
    assert clusterfed.FedClust(lambda_=1e6).name == "fedclust"
    # revisit = false: with it, the real groups' training updates split the one cluster in round 2
    result = run_user_app(clusterfed.FedClust(lambda_=1e6, revisit=False), 2)
    assert "within lambda" in result.clustering["one_cluster_reason"]


def test_evaluate_fn_is_called_with_the_initial_model_then_the_largest_clusters_model_each_round():
    """As Flower's Strategy.start: round 0 on initial_arrays, then each round."""
    from flwr.app import MetricRecord

    calls = []

    def evaluate_fn(server_round, arrays):
        calls.append((server_round, sorted(arrays)))
        return MetricRecord({"server-metric": float(server_round)})

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    grid = InProcessGrid(stock_client_app, 4, node_configs=[{"partition-id": i} for i in range(4)])
    result = clusterfed.FedAvg().start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()), num_rounds=2,
                                       train_config=ConfigRecord({"lr": 0.1}), evaluate_fn=evaluate_fn)
    assert calls == [(r, sorted(Net().state_dict())) for r in (0, 1, 2)]
    assert [result.evaluate_metrics_serverapp[r]["server-metric"] for r in (0, 1, 2)] == [0.0, 1.0, 2.0]


def test_a_run_in_which_no_train_reply_is_accepted_stops_quoting_the_clients_error():
    """A quickstart ClientApp that reads local-epochs from its run config, under a grid that
    gives it none: every train reply fails, and the run stops with the clients' own error."""
    from flwr.app import Message
    from flwr.clientapp import ClientApp

    broken = ClientApp()

    @broken.train()
    def train(msg: Message, context):
        return Message(RecordDict({}), reply_to=msg) if context.run_config["local-epochs"] else None

    from flwr.app import RecordDict

    for name in ("IFCA", "CFL"):
        strategy = getattr(clusterfed, name)()
        if name == "IFCA":
            with pytest.raises(clusterfed.CapabilityError):  # a stock client: refused before round 1
                run_user_app(strategy, 2, client_app=broken, num_clients=4)
            continue
        with pytest.raises(clusterfed.ClientFailureError, match="accepted in 2 round") as error:
            run_user_app(strategy, 3, client_app=broken, num_clients=4)
        assert "KeyError: 'local-epochs'" in str(error.value) and "node-1000" in str(error.value)
        assert strategy.driver.completed_rounds == 2


# ------------------------------------------------- stock clients: logs, errors, names
class RecordingGrid(InProcessGrid):
    """The in-process grid, remembering the type of every message sent."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sent: list[str] = []

    def push_messages(self, messages):
        messages = list(messages)
        self.sent += [m.metadata.message_type for m in messages]
        return super().push_messages(messages)


def recording_grid(client_app=stock_client_app, num_clients: int = 4) -> RecordingGrid:
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    return RecordingGrid(client_app, num_clients, node_configs=[{"partition-id": i} for i in range(num_clients)])


def test_a_stock_client_run_sends_only_what_it_answers_and_logs_one_info_line_a_round(caplog):
    caplog.set_level(logging.INFO, logger="flwr")
    grid = recording_grid()
    torch.manual_seed(0)
    clusterfed.FedAvg().start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()), num_rounds=3,
                              train_config=ConfigRecord({"lr": 0.1}))
    assert set(grid.sent) == {"train", "evaluate"}  # no query a stock ClientApp has no function for
    ours = [r.getMessage() for r in caplog.records if r.pathname.startswith(str(ROOT / "clusterfed"))]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    rounds = [line for line in ours if line.startswith("[ROUND")]
    # one line a round, one at the start, and the in-process grid's one line on why it runs a stock
    # ClientApp's clients one after another (it trains only the client helper's together)
    batching = [line for line in ours if line.startswith("client-batching: ")]
    assert len(rounds) == 3 and len(batching) == 1 and len(ours) == 3 + 1 + 1
    assert rounds[0].startswith("[ROUND 1/3] train: 4 of 4 replies accepted; 1 cluster; train loss ")
    assert "evaluate over 4 of 4 clients: eval_acc " in rounds[0] and "eval_loss" in rounds[0]


def test_the_clients_own_error_text_is_taken_out_of_the_simulation_engines_wrapper():
    from clusterfed.runner.replies import first_line

    ray = ("<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'\x1b[36mray::ClientAppActor.run()\x1b[39m "
           "(pid=1, ip=192.0.2.2)\n           ^^^^^\n  File \"/x/userapp/client_app.py\", line 19, in train_fn\n"
           "    loss = train(net, loader, epochs=int(context.run_config[\"local-epochs\"]))\n"
           "KeyError: 'local-epochs'\n\nThe above exception was the direct cause of the following exception:\n\n"
           "\x1b[36mray::ClientAppActor.run()\x1b[39m (pid=1)\n  File \"/x/ray_actor.py\", line 65, in run\n"
           "    raise ClientAppException(str(ex)) from ex\nflwr.clientapp.client_app.ClientAppException: \n"
           "Exception ClientAppException occurred. Message: 'local-epochs''>")
    assert first_line(ray) == "KeyError: 'local-epochs'"
    bare = "<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'ray::x\nException ClientAppException " \
           "occurred. Message: [client-key \"s-1\"] disk full'>"
    assert first_line(bare) == "disk full"


def test_a_model_that_does_not_match_the_clients_stops_in_round_1_naming_array_and_client():
    grid = recording_grid()
    float64 = {name: value.double() for name, value in Net().state_dict().items()}
    strategy = clusterfed.FedAvg()
    with pytest.raises(clusterfed.ModelMismatchError, match=r"client node-1000 .*hidden\.weight: dtype float32 != "
                                                           r"expected float64"):
        strategy.start(grid=grid, initial_arrays=ArrayRecord(float64), num_rounds=5,
                       train_config=ConfigRecord({"lr": 0.1}))
    assert strategy.driver.completed_rounds == 0 and grid.sent.count("train") == 4


def test_initial_arrays_the_clients_cannot_load_stop_before_round_1_with_torchs_own_words():
    """The probe evaluates start()'s initial_arrays: when a client's load_state_dict refuses
    them, the run stops as a model mismatch quoting torch's list, not as failing clients."""
    grid = recording_grid()
    other = {"fc.weight": torch.zeros(3, 5), "fc.bias": torch.zeros(3)}
    with pytest.raises(clusterfed.ModelMismatchError, match=r"(?s)initial_arrays are not the model the ClientApp "
                                                           r"trains.*Missing key\(s\) in state_dict"):
        clusterfed.FedClust().start(grid=grid, initial_arrays=ArrayRecord(other), num_rounds=2,
                                    train_config=ConfigRecord({"lr": 0.1}))
    assert "train" not in grid.sent


def test_a_name_filter_that_selects_nothing_is_a_parameter_error_of_the_strategy():
    for strategy in (clusterfed.FedClust(compare_arrays="nomatch.*"), clusterfed.CFL(compare_arrays="nomatch.*")):
        grid = recording_grid()
        with pytest.raises(StrategyParamsError, match=rf"^{strategy.name}: .*'nomatch\.\*'"):
            strategy.start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()), num_rounds=2,
                           train_config=ConfigRecord({"lr": 0.1}))
        assert "train" not in grid.sent


def test_adacfl_takes_stock_clients_and_says_pre_clustering_was_skipped():
    result = run_user_app(clusterfed.AdaCFL(), 2)
    assert result.clustering.get("preclustering") is False


def test_the_round_line_says_when_clients_were_asked_more_than_once(caplog):
    """FedClust's clustering step sends a stock client its own reply back until it has
    trained cluster-epochs: the round line counts replies and clients apart."""
    caplog.set_level(logging.INFO, logger="flwr")
    # chain-until = epochs: every client chains its 3 requests (stable may end the chain after 2)
    run_user_app(clusterfed.FedClust(cluster_epochs=3, chain_until="epochs"), 1, num_clients=4)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[ROUND 1/")]
    # 3 clustering requests a client (its epoch each), then the round's own training
    assert "train: 16 of 16 replies accepted from 4 clients (some asked more than once)" in line


def test_num_rounds_below_one_is_refused_before_any_message():
    grid = recording_grid()
    for rounds in (0, -1):
        with pytest.raises(StrategyParamsError, match=rf"num_rounds = {rounds}: a run needs at least one round"):
            clusterfed.CFL().start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()), num_rounds=rounds)
    assert grid.sent == []


def test_a_capability_refusal_comes_before_any_train_message():
    grid = recording_grid()
    with pytest.raises(clusterfed.CapabilityError):
        clusterfed.IFCA().start(grid=grid, initial_arrays=ArrayRecord(Net().state_dict()), num_rounds=2,
                                train_config=ConfigRecord({"lr": 0.1}))
    assert grid.sent == ["evaluate"] * 4  # the profile probe only


def named_client_app(how: str):
    """The stock user app, its evaluate replies naming the client (the way docs/library.md shows)."""
    from flwr.app import ConfigRecord as Config
    from flwr.clientapp import ClientApp
    from userapp.client_app import evaluate_fn, train_fn

    app = ClientApp()
    app.train()(train_fn)

    @app.evaluate()
    def evaluate(msg, context):
        reply = evaluate_fn(msg, context)
        partition = int(context.node_config["partition-id"])
        if how == "metric":
            reply.content["metrics"]["partition-id"] = partition
        else:
            reply.content["client"] = Config({"client-key": f"site-{partition}"})
        return reply

    return app


@pytest.mark.parametrize("how, keys", [("metric", [str(i) for i in range(6)]),
                                       ("record", [f"site-{i}" for i in range(6)])])
def test_a_stock_client_that_names_itself_is_keyed_by_that_name(how, keys):
    result = run_user_app(clusterfed.FedClust(), 2, client_app=named_client_app(how), num_clients=6)
    assert sorted(result.assignment) == sorted(keys)
    assert "partition-id" not in result.evaluate_metrics_clientapp[2]  # a name is not averaged


def test_the_strategies_show_their_parameters_and_the_package_its_names():
    import inspect

    signature = inspect.signature(clusterfed.FedClust)
    assert signature.parameters["lambda_"].default == "auto"
    assert signature.parameters["fraction_train"].default == 1.0
    assert signature.parameters["cluster_epochs"].kind is inspect.Parameter.KEYWORD_ONLY
    doc = clusterfed.FedClust.__doc__
    assert "lambda_ : float or 'auto', default 'auto' (run config: ``lambda``)" in doc
    assert clusterfed.FedClust.Params.model_fields["recut"].description in doc
    for name, cls in clustered_classes().items():
        assert list(inspect.signature(cls).parameters) == list(cls.Params.model_fields), name
    assert {"FedClust", "CFL", "IFCA", "CapabilityError", "ModelMismatchError"} <= set(dir(clusterfed))
    assert (ROOT / "clusterfed" / "py.typed").exists()


def test_the_type_stub_gives_ide_completion_each_strategys_keywords():
    """IDEs and type checkers read clusterfed/__init__.pyi, not the run-time signature: it is
    current, parses, and declares every Params field as a keyword of the strategy's __init__."""
    import ast

    from clusterfed import reference

    text = (ROOT / "clusterfed" / "__init__.pyi").read_text()
    assert text == reference.stub(), "run python -m clusterfed.reference --write"
    classes = {node.name: node for node in ast.parse(text).body if isinstance(node, ast.ClassDef)}
    for name, cls in clustered_classes().items():
        public = cls.__name__
        if public not in classes:
            continue  # a registered strategy that is not a public name (e.g. Flower's own FedAvg)
        init = next(n for n in classes[public].body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
        assert [a.arg for a in init.args.kwonlyargs] == list(cls.Params.model_fields), name
    assert {"FedClust", "CFL", "HiCFL", "IFCA", "AdaCFL"} <= set(classes)


def test_the_helpers_capabilities_are_the_strategies_capability_names():
    from clusterfed.client.app import HELPER_CAPABILITIES
    from clusterfed.strategies.base import CAPABILITIES

    assert set(HELPER_CAPABILITIES) == set(CAPABILITIES)


def test_clustered_result_summary_tabulates_rounds_and_lists_each_cluster_once():
    from flwr.app import MetricRecord

    from clusterfed import ClusteredResult

    result = ClusteredResult()
    result.train_metrics_clientapp = {2: MetricRecord({"train_loss": 0.5})}
    result.evaluate_metrics_clientapp = {1: MetricRecord({"eval_acc": 0.25}), 2: MetricRecord({"eval_acc": 0.75})}
    result.assignment = {"10": 1, "2": 0, "1": 1}
    result.clustering = {"one_cluster_reason": None}
    lines = result.summary("train_loss", "eval_acc").splitlines()
    assert lines[0].split() == ["round", "train_loss", "eval_acc"]
    assert lines[1].split() == ["1", "-", "0.25"] and lines[2].split() == ["2", "0.5", "0.75"]
    assert result.clusters() == {0: ["2"], 1: ["1", "10"]}  # numeric keys in numeric order
    assert lines[3:] == ["2 cluster(s):", "  cluster 0: 2", "  cluster 1: 1, 10"]
    result.assignment, result.clustering = {"a": 0}, {"one_cluster_reason": "no split passed its test"}
    assert result.summary().splitlines()[-1] == "one cluster because: no split passed its test"


def test_init_takes_flowers_array_record_as_configure_train_users_hold_one():
    record = ArrayRecord(Net().state_dict())
    strategy = clusterfed.FedAvg()
    strategy.init(record)
    assert set(strategy.models[0]) == set(record) and all(
        (strategy.models[0][name] == array.numpy()).all() for name, array in record.items())
