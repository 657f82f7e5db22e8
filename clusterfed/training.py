"""The one local SGD loop (``sgd``; the built-in task's ``train`` over arrays and the client
helper's default loop over a DataLoader both run it), evaluation, and model state <-> arrays."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn


def pick_device(spec: str = "auto") -> torch.device:
    """``auto`` takes CUDA when present; the same code runs on a GPU box and a Raspberry Pi."""
    if spec == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device = cuda was asked for but torch sees no CUDA device")
    if spec in ("cuda", "auto") and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")


def cap_threads() -> None:
    """One intra-op thread per client process unless told otherwise: simulation runs one
    client per core, and oversubscribed BLAS threads make small CNNs slower, not faster."""
    threads = int(os.environ.get("CLUSTERFED_TORCH_THREADS", "1"))
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


# torch dtype -> numpy dtype, for the dtypes both have
_NUMPY_DTYPES = {torch.float64: np.dtype(np.float64), torch.float32: np.dtype(np.float32),
                 torch.float16: np.dtype(np.float16), torch.int64: np.dtype(np.int64), torch.int32: np.dtype(np.int32),
                 torch.int16: np.dtype(np.int16), torch.int8: np.dtype(np.int8), torch.uint8: np.dtype(np.uint8),
                 torch.bool: np.dtype(np.bool_)}


BFLOAT16_MESSAGE = (
    "arrays {names} are bfloat16, which numpy has no dtype for: Flower's ArrayRecord cannot carry them "
    "(torch raises 'Got unsupported ScalarType BFloat16'). Exchange the model in float32 "
    "(model.float() before building the reply, model.to(torch.bfloat16) after loading the arrays) "
    "or use float16")


def state_to_numpy(model: nn.Module, copy: bool = True) -> dict[str, np.ndarray]:
    """The model's state as arrays; ``copy=False``: views of the model's own memory on the CPU
    (for a caller that copies them before the model changes, e.g. into a message).
    TypeError for a bfloat16 tensor, which numpy (and so a Flower ArrayRecord) cannot hold."""
    state = model.state_dict()
    bfloat16 = [k for k, v in state.items() if v.dtype == torch.bfloat16]
    if bfloat16:
        raise TypeError(BFLOAT16_MESSAGE.format(names=", ".join(bfloat16)))
    if copy:
        return {k: v.detach().cpu().numpy().copy() for k, v in state.items()}
    return {k: v.detach().cpu().numpy() for k, v in state.items()}


def load_numpy_state(model: nn.Module, arrays: Mapping[str, np.ndarray]) -> None:
    state = model.state_dict()
    if arrays.keys() != state.keys():
        expected, given = set(state), set(arrays)
        missing, extra = sorted(expected - given), sorted(given - expected)
        raise ValueError(f"model arrays do not match: missing {missing}, unexpected {extra}")
    # copied into the model's own tensors (cast to their dtype and device): what
    # load_state_dict does, without its per-module hook machinery on every message
    with torch.no_grad():
        for name, target in state.items():
            source = np.asarray(arrays[name])
            if tuple(source.shape) != tuple(target.shape):
                raise ValueError(f"array {name!r} has shape {tuple(source.shape)}, the model's is {tuple(target.shape)}")
            if not source.flags.writeable:  # a read-only view of a message's bytes
                if target.device.type == "cpu" and source.dtype == _NUMPY_DTYPES.get(target.dtype):
                    target.numpy()[...] = source  # the same copy, without torch's warning about read-only memory
                    continue
                source = source.copy()
            target.copy_(torch.from_numpy(source))


def sgd(model: nn.Module, epoch_batches: Callable[[], Iterable[tuple[torch.Tensor, torch.Tensor]]], *, epochs: int,
        lr: float, momentum: float, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        proximal_mu: float = 0.0, weight_decay: float = 0.0) -> float:
    """SGD with momentum (and L2 ``weight_decay``, as torch's SGD adds it to the gradient) for
    ``epochs`` passes, each over the ``(inputs, labels)`` batches that ``epoch_batches()``
    yields (on the model's device); returns the mean training loss.

    ``proximal_mu > 0`` adds FedProx's ``mu/2 * ||w - w_received||^2`` with the weights the
    model had on entry as ``w_received``.
    """
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    anchor = [p.detach().clone() for p in model.parameters()] if proximal_mu > 0 else None
    total, count = 0.0, 0
    for _ in range(epochs):
        for x, y in epoch_batches():
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            objective = loss
            if anchor is not None:
                drift = sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), anchor))
                objective = loss + 0.5 * proximal_mu * drift
            objective.backward()
            optimizer.step()
            total += float(loss.detach()) * len(y)
            count += len(y)
    return total / max(count, 1)


@dataclass(frozen=True)
class LocalSGD:
    """The arguments of one client's ``train`` over arrays: a task's train function that is
    exactly ``train(model, **vars(plan))`` says so (``trains_with``), and the in-process
    engine can then train many such clients together (``clusterfed.runner.batched_clients``)."""

    x: np.ndarray
    y: np.ndarray
    epochs: int
    batch_size: int
    lr: float
    momentum: float
    seed: int
    proximal_mu: float = 0.0
    weight_decay: float = 0.0


def trains_with(plan: Callable[[object, Mapping], LocalSGD]):
    """Mark a task's ``train_fn(model, data, config, device)`` as ``train`` with the arguments
    ``plan(data, config)`` gives (the batched client executor reads the mark)."""
    def mark(train_fn):
        train_fn.local_sgd = plan
        return train_fn

    return mark


def batch_orders(count: int, batch_size: int, epochs: int, seed: int) -> list[torch.Tensor]:
    """The example indices of each batch ``train`` takes, every epoch in turn: each epoch a
    fresh permutation drawn from ``seed``'s generator, cut into ``batch_size`` pieces."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(epochs):
        order = torch.randperm(count, generator=generator)
        out.extend(order[start:start + batch_size] for start in range(0, count, batch_size))
    return out


def train(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    momentum: float,
    seed: int,
    device: torch.device | None = None,
    proximal_mu: float = 0.0,
    weight_decay: float = 0.0,
) -> float:
    """``sgd`` over (x, y) in batches of ``batch_size``, reshuffled each epoch from ``seed``
    (``batch_orders``); returns the mean training loss."""
    device = device or torch.device("cpu")
    model.to(device)
    xt, yt = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
    orders = iter(batch_orders(len(xt), batch_size, epochs, seed))
    per_epoch = -(-len(xt) // batch_size)

    def shuffled() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for _, batch in zip(range(per_epoch), orders):
            batch = batch.to(device)
            yield xt[batch], yt[batch]

    return sgd(model, shuffled, epochs=epochs, lr=lr, momentum=momentum, loss_fn=nn.CrossEntropyLoss(),
               proximal_mu=proximal_mu, weight_decay=weight_decay)


EVALUATE_BATCH = 256  # ``evaluate``'s batch size


def evaluates_on(split: Callable[[object, Mapping], tuple[np.ndarray, np.ndarray]]):
    """Mark a task's ``evaluate_fn(model, data, config, device)`` as ``evaluate`` on the arrays
    ``split(data, config)`` gives, returning ``eval-loss`` and ``eval-accuracy`` (the batched
    client executor reads the mark)."""
    def mark(evaluate_fn):
        evaluate_fn.evaluated_on = split
        return evaluate_fn

    return mark


@torch.no_grad()
def evaluate(
    model: nn.Module, x: np.ndarray, y: np.ndarray, *, batch_size: int = EVALUATE_BATCH, device: torch.device | None = None
) -> tuple[float, float]:
    """Mean cross-entropy loss and accuracy on (x, y)."""
    device = device or torch.device("cpu")
    model.to(device).eval()
    if len(x) == 0:
        return 0.0, 0.0
    loss_sum, correct = 0.0, 0
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    for start in range(0, len(x), batch_size):
        xb = torch.from_numpy(x[start : start + batch_size]).to(device)
        yb = torch.from_numpy(y[start : start + batch_size]).to(device)
        logits = model(xb)
        loss_sum += float(loss_fn(logits, yb))
        correct += int((logits.argmax(1) == yb).sum())
    return loss_sum / len(x), correct / len(x)
