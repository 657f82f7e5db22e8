"""What each client of a batched round does, step by step (``of``), which clients can share
one stack (``model_signature``), and the chunks they are trained in (``in_chunks``): sized
from the device's free memory and, on the CPU, its cache (``chunk_size``), halved and retried
when the device runs out of memory anyway.

Imported by the batched client executor when it first batches a round (it imports torch).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

import numpy as np
import torch
from flwr.app import MessageType
from torch import nn

from clusterfed.client.loops import batches, loss_fn, sgd_options
from clusterfed.runner.batched_training import (ClientSteps, activation_bytes, evaluate_together, stack_states,
                                                train_together, trained_states)
from clusterfed.training import EVALUATE_BATCH, batch_orders

BUILTIN_LOSS = "cross-entropy"
# on the CPU, a chunk's activations (as ``activation_bytes`` counts them) within about the
# size of a server CPU's last-level cache
CPU_CHUNK_ACTIVATIONS = 16 << 20


def model_signature(model: nn.Module) -> tuple:
    """Clients whose models have the same signature are trained as one stack: the class, its
    layers as printed (kinds and their options) and every state entry's name, shape and dtype."""
    state = tuple((name, tuple(t.shape), str(t.dtype)) for name, t in model.state_dict().items())
    return type(model), repr(model), state


def loss_of(task, kind: str) -> Callable:
    """The loss the client's loop minimises or reports: cross-entropy for the built-in task's
    marked functions, the task's ``loss_fn`` (default cross-entropy) for the default loops."""
    own = task.train_fn if kind == MessageType.TRAIN else task.evaluate_fn
    return nn.CrossEntropyLoss() if own is not None else loss_fn(task)


def _materialised(task, loader, device: torch.device, epochs: int) -> ClientSteps:
    """The default loop's batches of ``loader``, every epoch, as one client's steps."""
    xs, ys = [], []
    for _ in range(epochs):
        for x, y in batches(task, loader, device):
            xs.append(x)
            ys.append(y)
    if not xs:
        return ClientSteps(torch.zeros(0), torch.zeros(0, dtype=torch.long), [])
    starts = np.cumsum([0] + [len(x) for x in xs])
    return ClientSteps(torch.cat(xs), torch.cat(ys), [torch.arange(a, b) for a, b in zip(starts[:-1], starts[1:])])


def of(task, kind: str, model: nn.Module, data, config: Mapping, device: torch.device) -> tuple[ClientSteps, str]:
    """One client's steps and the key of the loss it uses (clients of one stack share it)."""
    if kind == MessageType.TRAIN:
        if task.train_fn is not None:
            plan = task.train_fn.local_sgd(data, config)
            x, y = torch.from_numpy(np.asarray(plan.x)), torch.from_numpy(np.asarray(plan.y))
            steps = batch_orders(len(x), plan.batch_size, plan.epochs, plan.seed)
            return ClientSteps(x, y, steps, plan.lr, plan.momentum, plan.weight_decay, plan.proximal_mu), BUILTIN_LOSS
        options = sgd_options(config)
        steps = _materialised(task, data.train, device, options["epochs"])
        steps.lr, steps.momentum = options["lr"], options["momentum"]
        steps.weight_decay, steps.proximal_mu = options["weight_decay"], options["proximal_mu"]
        return steps, str(id(task))
    if task.evaluate_fn is not None:
        x, y = (torch.from_numpy(np.asarray(a)) for a in task.evaluate_fn.evaluated_on(data, config))
        return ClientSteps(x, y, list(torch.arange(len(x)).split(EVALUATE_BATCH))), BUILTIN_LOSS
    if getattr(data, "test", None) is None:
        raise ValueError("no test data")  # the default loop's own error, one after another
    return _materialised(task, data.test, device, 1), str(id(task))


def free_bytes(device: torch.device) -> int:
    """Free memory on ``device``: CUDA's own count, else the machine's available memory."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 2 << 30


def chunk_size(model: nn.Module, work: list[ClientSteps], device: torch.device, training: bool, share: float) -> int:
    """How many clients to stack at once. Memory: an upper estimate of one client's bytes (its
    state, with gradients, momentum and proximal anchor when training; its laid-out batches;
    one step's activations, three times over when training: saved for backward and their
    gradients) into ``share`` of the free memory. On the CPU also the cache: a chunk whose
    activations outgrow ``CPU_CHUNK_ACTIVATIONS`` runs its elementwise layers from main memory,
    slower than the same clients one after another."""
    state = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    widest = max(work, key=lambda w: max(w.sizes, default=0))
    steps = max(len(w.steps) for w in work)
    width = max(widest.sizes, default=0)
    sample = widest.x[:1]
    data = steps * width * (sample.numel() * sample.element_size() + widest.y[:1].numel() * widest.y.element_size())
    activations = 0
    if width and len(widest.x):
        activations = activation_bytes(model, widest.x[:width].to(device))
    per_client = state * (5 if training else 2) + data + activations * (3 if training else 1)
    size = int(share * free_bytes(device) // max(per_client, 1))
    if device.type == "cpu":
        size = min(size, CPU_CHUNK_ACTIVATIONS // max(activations, 1))
    return max(1, min(len(work), size))


def _out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.cuda.OutOfMemoryError) or "can't allocate memory" in str(error)


def in_chunks(model: nn.Module, kind: str, received: list[Mapping[str, np.ndarray]], work: list[ClientSteps],
              loss: Callable, device_name: str, seed: int, max_chunk: int | None,
              share: float) -> Iterator[tuple[range, list[tuple], float, int]]:
    """Train (or evaluate) the clients chunk by chunk: (the chunk's client indices, each
    client's (state, mean loss) or (loss, accuracy), seconds, peak device bytes)."""
    device = torch.device(device_name)
    model.to(device)
    training = kind == MessageType.TRAIN
    # clients with the same batch sizes side by side: their steps are contiguous slices
    order = sorted(range(len(work)), key=lambda i: work[i].sizes)
    size = chunk_size(model, work, device, training, share)
    if max_chunk:
        size = min(size, max_chunk)
    start = 0
    while start < len(order):
        chunk = order[start:start + size]
        try:
            results, seconds, peak = _one_chunk(model, training, [received[i] for i in chunk],
                                                [work[i] for i in chunk], loss, device, seed + start)
        except (RuntimeError, MemoryError) as error:
            if size == 1 or not _out_of_memory(error):
                raise
            size //= 2  # the estimate was short: the same clients again, in smaller chunks
            continue
        yield chunk, results, seconds, peak
        start += len(chunk)


def _one_chunk(model: nn.Module, training: bool, received: list, work: list[ClientSteps], loss: Callable,
               device: torch.device, seed: int) -> tuple[list[tuple], float, int]:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    cuda = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)  # dropout's draws: the same run, the same draws
        stacked = stack_states(model, received, device)
        if training:
            losses = train_together(model, stacked, work, loss, device)
            results = [(state, float(value)) for state, value in zip(trained_states(model, stacked), losses)]
        else:
            results = [(value, accuracy) for value, accuracy, _ in evaluate_together(model, stacked, work, loss, device)]
    peak = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else 0
    return results, time.perf_counter() - started, peak
