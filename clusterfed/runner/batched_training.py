"""Many clients' local SGD, or evaluation, at once: their models stacked along a new first
dimension and one ``torch.func.vmap(grad(functional_call))`` per step for all of them.

Each client does what it would do alone (``clusterfed.training.sgd``): its own batches in its
own order, its own SGD momentum buffer and weight decay (torch's SGD arithmetic), FedProx's
proximal term towards the model it received, BatchNorm on its own buffers in train mode, and
dropout with its own random draws (``vmap(..., randomness="different")``). Clients go in
lock step; at step ``s`` those whose ``s``-th batch has the same size are one vmapped call,
so no batch is padded (a padded example would enter BatchNorm's batch statistics) and a
client with fewer batches simply stops. Clients are ordered by their batch sizes first, so
that such a group is almost always a contiguous slice of the stacks (views, updated in
place); otherwise it is gathered and written back.

The sums inside a vmapped convolution run in another order than a single client's, so the
trained weights agree with one-by-one training to float rounding, not bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap


@dataclass
class ClientSteps:
    """One client's work: its examples ``x``, ``y`` and the example indices of each step in
    order (every epoch's batches); for training, its SGD hyper-parameters."""

    x: torch.Tensor
    y: torch.Tensor
    steps: list[torch.Tensor]
    lr: float = 0.0
    momentum: float = 0.0
    weight_decay: float = 0.0
    proximal_mu: float = 0.0

    @property
    def sizes(self) -> list[int]:
        return [len(step) for step in self.steps]


def _lay_out(work: list[ClientSteps], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Every client's batches as ``X[client, step, :size]`` (zero padding after), the labels
    alike, and the sizes ``[client, step]`` (0: no such step)."""
    num_steps = max((len(w.steps) for w in work), default=0)
    sizes = np.zeros((len(work), num_steps), dtype=np.int64)
    for i, w in enumerate(work):
        sizes[i, :len(w.steps)] = w.sizes
    width = int(sizes.max(initial=0))
    sample = next((w for w in work if len(w.x)), work[0])
    xs = torch.zeros((len(work), num_steps * width, *sample.x.shape[1:]), dtype=sample.x.dtype, device=device)
    ys = torch.zeros((len(work), num_steps * width, *sample.y.shape[1:]), dtype=sample.y.dtype, device=device)
    for i, w in enumerate(work):
        if not w.steps or not sizes[i].any():
            continue
        slots = torch.cat([s * width + torch.arange(n) for s, n in enumerate(w.sizes)]).to(device)
        index = torch.cat(w.steps).to(w.x.device)
        xs[i, slots] = w.x[index].to(device)
        ys[i, slots] = w.y[index].to(device)
    shape = (len(work), num_steps, width)
    return xs.view(*shape, *xs.shape[2:]), ys.view(*shape, *ys.shape[2:]), sizes


def _groups(sizes: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(size, members) of the clients with a batch of that size at this step."""
    return [(int(size), np.flatnonzero(sizes == size)) for size in np.unique(sizes) if size > 0]


def _selector(members: np.ndarray, device: torch.device) -> slice | torch.Tensor:
    first, last = int(members[0]), int(members[-1])
    if last - first + 1 == len(members):
        return slice(first, last + 1)
    return torch.as_tensor(members, device=device)


def _take(stack: torch.Tensor, where: slice | torch.Tensor) -> torch.Tensor:
    return stack[where] if isinstance(where, slice) else stack.index_select(0, where)


def _put(stack: torch.Tensor, where: slice | torch.Tensor, values: torch.Tensor) -> None:
    """Write back what ``_take`` gathered (a slice's view was updated in place already)."""
    if not isinstance(where, slice):
        stack.index_copy_(0, where, values)


def _per_client(values: list[float], members: np.ndarray, like: torch.Tensor) -> float | torch.Tensor:
    """The members' values of a hyper-parameter: one number when they share it (torch's SGD
    arithmetic exactly), else a tensor broadcasting over each client's dimensions."""
    chosen = [values[i] for i in members]
    if all(v == chosen[0] for v in chosen):
        return chosen[0]
    return torch.tensor(chosen, dtype=like.dtype, device=like.device).view(-1, *([1] * (like.dim() - 1)))


def stack_states(model: nn.Module, states: list[Mapping[str, np.ndarray]], device: torch.device) -> dict[str, torch.Tensor]:
    """The clients' states as one tensor per state-dict entry, in the model's dtypes."""
    reference = model.state_dict()
    return {name: torch.from_numpy(np.stack([np.asarray(state[name]) for state in states])).to(
        device=device, dtype=tensor.dtype) for name, tensor in reference.items()}


def train_together(model: nn.Module, stacked: dict[str, torch.Tensor], work: list[ClientSteps],
                   loss_fn: Callable, device: torch.device) -> np.ndarray:
    """Train the clients whose states are ``stacked`` (updated in place) on their ``work``;
    returns each client's mean training loss (float64), as ``sgd`` computes it."""
    model.train()
    params = dict(model.named_parameters())
    trainable = [name for name in stacked if name in params and params[name].requires_grad]
    fixed = [name for name in stacked if name not in trainable]
    xs, ys, sizes = _lay_out(work, device)
    momentum_buffers = {name: torch.zeros_like(stacked[name]) for name in trainable}
    proximal = any(w.proximal_mu > 0 for w in work)
    anchors = {name: stacked[name].clone() for name in trainable} if proximal else None
    mus = torch.tensor([w.proximal_mu for w in work], device=device)
    totals = torch.zeros(len(work), dtype=torch.float64, device=device)
    counts = torch.zeros(len(work), dtype=torch.float64, device=device)

    def objective(own, rest, anchor, mu, x, y):
        loss = loss_fn(functional_call(model, {**own, **rest}, (x,)), y)
        if anchor is None:
            return loss, loss
        drift = sum(((own[name] - anchor[name]) ** 2).sum() for name in own)
        return loss + 0.5 * mu * drift, loss

    gradient = grad(objective, has_aux=True)
    for step in range(sizes.shape[1]):
        for size, members in _groups(sizes[:, step]):
            where = _selector(members, device)
            own = {name: _take(stacked[name], where) for name in trainable}
            rest = {name: _take(stacked[name], where) for name in fixed}
            anchor = {name: _take(anchors[name], where) for name in trainable} if proximal else None
            batched = vmap(gradient, in_dims=(0, 0, 0 if proximal else None, 0, 0, 0), randomness="different")
            grads, loss = batched(own, rest, anchor, _take(mus, where), xs[where, step, :size], ys[where, step, :size])
            with torch.no_grad():
                for name in trainable:
                    _sgd_step(own[name], grads[name], _take(momentum_buffers[name], where), work, members,
                              stacked[name], momentum_buffers[name], where)
                for name in fixed:  # BatchNorm's running statistics, updated inside the call
                    _put(stacked[name], where, rest[name])
                totals.index_add_(0, torch.as_tensor(members, device=device), loss.detach().double() * size)
                counts.index_add_(0, torch.as_tensor(members, device=device),
                                  torch.full((len(members),), float(size), dtype=torch.float64, device=device))
    return (totals / counts.clamp(min=1)).cpu().numpy()


def _sgd_step(param: torch.Tensor, gradient: torch.Tensor, buffer: torch.Tensor, work: list[ClientSteps],
              members: np.ndarray, param_stack: torch.Tensor, buffer_stack: torch.Tensor,
              where: slice | torch.Tensor) -> None:
    """torch.optim.SGD's step (no dampening, no Nesterov) on the members' rows: the gradient
    plus weight decay, the momentum buffer (starting from zeros: its first value is the
    gradient, as torch's first step sets it), the step."""
    decay = _per_client([w.weight_decay for w in work], members, param)
    if not isinstance(decay, float):
        gradient = gradient + param * decay
    elif decay:
        gradient = gradient.add(param, alpha=decay)
    momentum = _per_client([w.momentum for w in work], members, param)
    buffer.mul_(momentum).add_(gradient)
    lr = _per_client([w.lr for w in work], members, param)
    if isinstance(lr, float):
        param.add_(buffer, alpha=-lr)
    else:
        param.sub_(buffer * lr)
    _put(param_stack, where, param)
    _put(buffer_stack, where, buffer)


@torch.no_grad()
def evaluate_together(model: nn.Module, stacked: dict[str, torch.Tensor], work: list[ClientSteps],
                      loss_fn: Callable, device: torch.device) -> list[tuple[float, float, int]]:
    """(mean loss, accuracy, examples) of each client's model on its ``work`` batches, in
    eval mode; accuracy counts argmax hits where outputs are (examples, classes) and labels
    (examples,), as the default loops do."""
    model.eval()
    xs, ys, sizes = _lay_out(work, device)
    totals = np.zeros(len(work))
    hits = np.zeros(len(work), dtype=np.int64)

    def scored(state, x, y):
        outputs = functional_call(model, state, (x,))
        loss = loss_fn(outputs, y)
        right = (outputs.argmax(1) == y).sum() if outputs.dim() == 2 and y.dim() == 1 else torch.zeros((), dtype=torch.long)
        return loss, right

    batched = vmap(scored, randomness="different")
    for step in range(sizes.shape[1]):
        for size, members in _groups(sizes[:, step]):
            where = _selector(members, device)
            loss, right = batched({name: _take(t, where) for name, t in stacked.items()},
                                  xs[where, step, :size], ys[where, step, :size])
            totals[members] += loss.double().cpu().numpy() * size
            hits[members] += right.cpu().numpy()
    counts = sizes.sum(axis=1)
    return [(float(totals[i] / counts[i]), float(hits[i] / counts[i]), int(counts[i])) if counts[i] else (0.0, 0.0, 0)
            for i in range(len(work))]


def trained_states(model: nn.Module, stacked: dict[str, torch.Tensor]) -> list[dict[str, np.ndarray]]:
    """Each client's state as arrays in state-dict order: views of one CPU copy of the stacks
    (a reply copies them into its bytes)."""
    on_cpu = {name: tensor.detach().cpu() for name, tensor in stacked.items()}
    count = len(next(iter(on_cpu.values()))) if on_cpu else 0
    return [{name: tensor[i].numpy() for name, tensor in on_cpu.items()} for i in range(count)]


def activation_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """What a forward pass of one client's batch ``x`` writes: the bytes of every module's
    output (containers included, so an over-estimate), for sizing chunks."""
    total = 0

    def count(module, inputs, output):
        nonlocal total
        if isinstance(output, torch.Tensor):
            total += output.numel() * output.element_size()

    handles = [module.register_forward_hook(count) for module in model.modules()]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    return total
