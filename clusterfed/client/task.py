"""A client task: the user's model, data and (optionally) training and evaluation functions.

Nothing here imports torch: ``clusterfed.client_entry`` (the ClientApp Flower starts once per
message on a device) imports this module and hands the work to a warm worker, which is where
the task's functions and torch are loaded. The default training and evaluation loops live in
``clusterfed.client.loops`` and are imported when first used.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import import_module
from typing import TYPE_CHECKING, Any

from flwr.supercore import log

from clusterfed.client.identity import client_key

if TYPE_CHECKING:  # pragma: no cover - types only
    import torch
    from flwr.app import Context
    from torch import nn

Config = dict[str, Any]  # the message's ConfigRecord as a plain dict

# what a task can give beyond a stock ClientApp (the names of clusterfed.core.contract's
# CAPABILITIES, which a strategy's ``requires()`` returns)
MULTI_MODEL = "multi-model"  # choose the lowest-training-loss model among K (IFCA)
LABEL_STATS = "label-stats"  # label statistics in the profile (AdaCFL's pre-clustering)
# how a task that cannot give a capability gets it
HOW_TO_GIVE = {
    MULTI_MODEL: ("a task with its own train_fn must give ClientTask the loss it trains (loss_fn=..., the "
                  "criterion its train_fn minimises) or a train_loss_fn (the loss on the training data): "
                  "the client keeps the model of lowest training loss among the K it is sent"),
    LABEL_STATS: "return TaskData(train, test, labels=y_train) from data_fn",
}


class TaskCapabilityError(ValueError):
    """A task built for a strategy cannot give what that strategy needs (``ClientTask.require``)."""


@dataclass(frozen=True)
class TaskData:
    """One client's data, as a task's ``data_fn`` returns it.

    ``train`` and ``test`` are whatever the task's train and evaluate functions take; the
    default loops take iterables of ``(inputs, labels)`` batches (``torch.utils.data.DataLoader``)
    or of dict batches (``ClientTask.batch_keys``). ``labels``: the training labels (any
    array-like), for the label statistics some algorithms ask for; None: no statistics are
    reported. ``true_group``: the client's known group, for metrics only (-1: unknown).
    ``num_train`` / ``num_test``: the example counts reported as ``num-examples``; None: the
    length of ``train.dataset`` / ``test.dataset`` (a DataLoader's data set).
    """

    train: Any
    test: Any = None
    labels: Any = None
    true_group: int = -1
    num_train: int | None = None
    num_test: int | None = None


def as_task_data(data: Any) -> Any:
    """A ``(train, test)`` pair becomes ``TaskData(train, test)``; anything else is used as it
    is (a ``TaskData``, or any object with its attributes)."""
    if isinstance(data, tuple) and len(data) == 2:
        return TaskData(train=data[0], test=data[1])
    if not hasattr(data, "train"):
        raise TypeError(f"data_fn returned {type(data).__name__}: return a TaskData, a (train, test) pair "
                        "of DataLoaders, or an object with TaskData's attributes")
    return data


def count_examples(data: Any, split: str) -> int:
    """``num_train`` / ``num_test`` of ``data``, else the length of the split's ``dataset``."""
    count = getattr(data, f"num_{split}", None)
    if count is not None:
        return int(count)
    loader = getattr(data, split, None)
    dataset = getattr(loader, "dataset", None)
    if dataset is None or not hasattr(dataset, "__len__"):
        raise ValueError(f"cannot count the {split}ing examples ({split} is a {type(loader).__name__} without a "
                         f"sized .dataset): return TaskData(..., num_{split}=N) from data_fn")
    return len(dataset)


@dataclass(frozen=True)
class ClientTask:
    """What a client brings: functions of the Flower ``Context`` and the message's config.

    - ``model_fn(context, config) -> nn.Module``: the model; the arrays a message carries are
      loaded into it (names and shapes must match its ``state_dict``).
    - ``data_fn(context, config) -> TaskData | (train, test)``: this client's data. The
      context's node config holds what belongs to the device (``partition-id``,
      ``data-path``, ...); the config holds the message's keys (``server-round``, ``lr``, ...)
      and whatever the ServerApp added as ``train_config`` / ``evaluate_config``.
    - ``train_fn(model, data, config, device) -> float | Mapping``: trains ``model`` in
      place and returns the mean training loss, or metrics holding ``train-loss`` (and
      ``num-examples`` if it should not be counted from the data). Default:
      SGD with ``lr``, ``local-epochs``, ``momentum`` (default 0) from the config, plus
      FedProx's proximal term when ``proximal-mu`` > 0, minimising ``loss_fn``. Your own
      must train ``config["local-epochs"]`` epochs: FedClust's and AdaCFL's clustering round
      asks ``cluster-epochs`` (10 by default) through it, and a function that trains a fixed
      count of its own compares clients after too little training (a weaker or wrong cut), with
      nothing on the server to tell. Return ``{"train-loss": ..., "local-epochs": epochs_trained}``
      to have it checked: a count other than the one asked is logged as a warning (once per
      pair) and travels in the reply.
    - ``evaluate_fn(model, data, config, device) -> Mapping[str, float]``: the evaluation
      metrics on ``data.test`` (``num-examples`` as for ``train_fn``). Default: ``eval-loss`` (``loss_fn``) and ``eval-accuracy``
      (argmax of the outputs; classification).
    - ``train_loss_fn(model, data, config, device) -> float``: the loss on the *training*
      data, which decides IFCA's choice among the models it sends. Default: ``loss_fn``
      averaged over ``data.train``; a task with its own ``train_fn`` and non-batch data must
      give one to take part in IFCA. A task with its own ``train_fn`` and neither ``loss_fn``
      nor ``train_loss_fn`` cannot choose (``capabilities()`` leaves out ``multi-model``): its
      profile tells the server so, and ``client_app(task, requires=...)`` refuses it at once.
    - ``key_fn(context) -> str``: the client's stable key. Default: node config
      ``client-key``, else derived from ``data-path`` (its contents' hash) or ``partition-id``.
    - ``loss_fn``: the criterion of the default loops (default ``nn.CrossEntropyLoss()``).
    - ``batch_keys``: the (inputs, labels) keys of dict batches, e.g. Flower Datasets' images.
    """

    model_fn: Callable[[Context, Config], nn.Module]
    data_fn: Callable[[Context, Config], Any]
    train_fn: Callable[[nn.Module, Any, Config, torch.device], float | Mapping[str, float]] | None = None
    evaluate_fn: Callable[[nn.Module, Any, Config, torch.device], Mapping[str, float]] | None = None
    train_loss_fn: Callable[[nn.Module, Any, Config, torch.device], float] | None = None
    key_fn: Callable[[Context], str] | None = None
    loss_fn: Callable[..., Any] | None = None
    batch_keys: tuple[str, str] = ("img", "label")

    def __post_init__(self) -> None:
        for name in ("model_fn", "data_fn"):
            if not callable(getattr(self, name)):
                raise TypeError(f"ClientTask.{name} must be a function, got {getattr(self, name)!r}")
        for name in ("train_fn", "evaluate_fn", "train_loss_fn", "key_fn", "loss_fn"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise TypeError(f"ClientTask.{name} must be a function or None, got {value!r}")
        if len(tuple(self.batch_keys)) != 2:
            raise TypeError(f"ClientTask.batch_keys must name (inputs, labels), got {self.batch_keys!r}")

    def can_choose_model(self) -> bool:
        """Whether this task can compute the training loss that decides IFCA's choice: the
        default loop's ``loss_fn`` (given, or the default criterion when the default loop
        trains), or a ``train_loss_fn``."""
        return self.train_fn is None or self.loss_fn is not None or self.train_loss_fn is not None

    def capabilities(self, data: Any = None) -> tuple[str, ...]:
        """What this task gives beyond a stock ClientApp, by capability name: ``multi-model``
        when it can choose among K models (``can_choose_model``); ``label-stats`` when ``data``
        (this client's, as ``data_fn`` returned it) has labels, or, with no data, always (the
        data decides)."""
        given = []
        if data is None or getattr(data, "labels", None) is not None:
            given.append(LABEL_STATS)
        if self.can_choose_model():
            given.append(MULTI_MODEL)
        return tuple(given)

    def require(self, needed) -> None:
        """Raise ``TaskCapabilityError`` (one message saying how to give each) when this task
        cannot give a capability of ``needed`` (names, e.g. a strategy's ``requires()``).
        ``label-stats`` depends on the data and is not checked here (the profile reports it)."""
        unknown = sorted(set(needed) - set(HOW_TO_GIVE))
        if unknown:
            raise ValueError(f"unknown client capabilities {unknown}; the helper's are {sorted(HOW_TO_GIVE)}")
        missing = [name for name in sorted(set(needed)) if name != LABEL_STATS and name not in self.capabilities()]
        if missing:
            raise TaskCapabilityError(
                "this ClientTask cannot give what the strategy needs: "
                + "; ".join(f"{name} ({HOW_TO_GIVE[name]})" for name in missing))

    def key(self, context: Context) -> str:
        if self.key_fn is not None:
            return str(self.key_fn(context))

        return client_key(context.node_config)

    def train(self, model, data, config: Config, device) -> dict[str, float]:
        """Train; the metrics with ``train-loss`` first."""
        if self.train_fn is None:
            from clusterfed.client.loops import default_train

            result = default_train(self, model, data, config, device)
        else:
            watched = _ReadWatch(config)
            result = self.train_fn(model, data, watched, device)
            if isinstance(result, Mapping) and "local-epochs" in result:
                _check_epochs(config, result["local-epochs"])
            elif "local-epochs" in config and not watched.read_epochs:
                _epochs_unread(config)
        if isinstance(result, Mapping):
            if "train-loss" not in result:
                raise ValueError(f"train_fn returned metrics without 'train-loss': {sorted(result)}")
            return {"train-loss": float(result["train-loss"]), **{k: v for k, v in result.items() if k != "train-loss"}}
        return {"train-loss": float(result)}

    def evaluate(self, model, data, config: Config, device) -> dict[str, Any]:
        if self.evaluate_fn is None:
            from clusterfed.client.loops import default_evaluate

            return default_evaluate(self, model, data, config, device)
        metrics = self.evaluate_fn(model, data, config, device)
        if not isinstance(metrics, Mapping):
            raise TypeError(f"evaluate_fn must return a dict of metrics, got {type(metrics).__name__}")
        return dict(metrics)

    def train_loss(self, model, data, config: Config, device) -> float:
        if self.train_loss_fn is not None:
            return float(self.train_loss_fn(model, data, config, device))
        from clusterfed.client.loops import default_train_loss

        return default_train_loss(self, model, data, config, device)


_EPOCH_WARNINGS: set[tuple[Any, Any]] = set()


def _check_epochs(config: Mapping, trained: Any) -> None:
    """A train_fn that reports the epochs it trained (metric ``local-epochs``) and trained
    other than the message's ``local-epochs``: a warning, once per (asked, trained) pair."""
    asked = config.get("local-epochs")
    if asked is None or trained == asked or (asked, trained) in _EPOCH_WARNINGS:
        return
    _EPOCH_WARNINGS.add((asked, trained))
    log(logging.WARNING, "the task's train_fn trained %s epoch(s) where the message asked local-epochs=%s%s: "
        "train config['local-epochs'] epochs (FedClust's and AdaCFL's clustering round asks cluster-epochs through "
        "it, and compares clients after what they trained)", trained, asked,
        f" (with upload={config['upload']!r}, a clustering round)" if config.get("upload", "full") != "full" else "")


class _ReadWatch(dict):
    """The message config handed to a task's own ``train_fn``, noting whether it read
    ``local-epochs`` (by key, ``get``, or by copying or iterating the whole config)."""

    read_epochs = False

    def _note(self, key: Any) -> None:
        if key == "local-epochs":
            self.read_epochs = True

    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._note(key)
        return super().get(key, default)

    def __contains__(self, key):
        self._note(key)
        return super().__contains__(key)

    def __iter__(self):  # dict(config), {**config}, for key in config: every key may be read
        self.read_epochs = True
        return super().__iter__()

    def keys(self):
        self.read_epochs = True
        return super().keys()

    def items(self):
        self.read_epochs = True
        return super().items()

    def values(self):
        self.read_epochs = True
        return super().values()

    def copy(self):
        self.read_epochs = True
        return dict(super().items())


_UNREAD_WARNED: set[str] = set()


def _epochs_unread(config: Mapping) -> None:
    """A task's own train_fn that never read the message's ``local-epochs`` trains a count of
    its own: in a clustering round (FedClust's, AdaCFL's ``cluster-epochs``) the clients are
    then compared after too little training. A warning, once per process and round kind."""
    clustering = config.get("upload", "full") != "full" or config.get("phase") in ("cluster", "placement")
    kind = "cluster" if clustering else "train"
    if kind in _UNREAD_WARNED:
        return
    _UNREAD_WARNED.add(kind)
    where = (f" This is a clustering round (FedClust's / AdaCFL's cluster-epochs = {config['local-epochs']}): the "
             "clients are compared after what they trained." if clustering else "")
    log(logging.WARNING, "the task's train_fn did not read config['local-epochs'] (= %s): if it trains a fixed "
        "count of its own, read config['local-epochs'] instead, or return {'train-loss': ..., 'local-epochs': n} "
        "to have the count checked.%s", config["local-epochs"], where)


@lru_cache(maxsize=16)
def load_task(path: str) -> ClientTask:
    """The ``ClientTask`` named by ``"package.module:name"`` (imported once per process)."""
    module_name, sep, attribute = str(path).partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"client task {path!r}: write it as \"package.module:name\"")
    try:
        module = import_module(module_name)
    except ImportError as error:
        raise ImportError(f"client task {path!r}: cannot import {module_name!r} ({error})") from error
    task = getattr(module, attribute, None)
    if not isinstance(task, ClientTask):
        raise TypeError(f"client task {path!r} is {type(task).__name__}, not a clusterfed.client.ClientTask")
    return task
