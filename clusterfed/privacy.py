"""Client-level differential privacy for clustered strategies: each reply's update clipped
against the model it was sent, Gaussian noise on each cluster's average, and an RDP
accountant per client.

Every clustered strategy takes ``dp_noise_multiplier``, ``dp_clipping_norm`` and ``dp_delta``
(run config ``dp-noise-multiplier``, ``dp-clipping-norm``, ``dp-delta``). With them the
within-cluster average becomes the Gaussian mechanism of McMahan et al., "Learning
Differentially Private Recurrent Language Models", as Flower's
``DifferentialPrivacyServerSideFixedClipping`` applies it to one global model:

- each full train reply's update (floating-point arrays) is clipped to L2 norm
  ``clipping_norm`` with Flower's ``compute_clip_model_update``; integer and bool arrays
  (counters, masks) keep the cluster's values, since they would be released without noise;
- the clipped replies are averaged with equal weights (a weight by num-examples would let one
  client move the average by more than ``clipping_norm / m``);
- noise of standard deviation ``noise_multiplier * clipping_norm / m`` (Flower's
  ``compute_stdv``), ``m`` the cluster's replies averaged this round, is added to every
  floating-point array of the cluster's average, drawn from the strategy's seeded generator.

The train messages carry ``clipping_norm`` under Flower's key, so a ClientApp built with
Flower's ``fixedclipping_mod`` clips before anything leaves the device (the server clips
again; a clipped update is unchanged by it).

Accounting: a client's privacy loss is the composition of the noisy releases its clipped
update went into (one per round at most: a client trains in one cluster per round), counted
with Flower's RDP accountant (``flwr.supercore.privacy_accounting``, backed by Google's
dp-accounting: ``pip install "clusterfed[privacy]"``) without amplification by sampling
(clients are sampled over all clusters at once, so a cluster's count of trainers is neither
Poisson nor fixed; Flower's accounted DP wrappers make the same choice). A cluster's ε is the
largest of its members', the run's the largest of all clients', clients that moved between
clusters included. The clustering steps see individual (clipped) updates; their output, the
assignment, is not covered (see docs/privacy.md).
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass
from typing import Any

import numpy as np

from flwr.supercore.differential_privacy import (
    KEY_CLIPPING_NORM,
    compute_clip_model_update,
    compute_stdv,
    get_norm,
)
from flwr.supercore.privacy_accounting import (
    GaussianPrivacyEvent,
    NeighboringRelation,
    PrivacyConfig,
    SamplingMethod,
)
from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

from clusterfed.core.exchange import Arrays, TrainReply, difference

# the train config key Flower's fixedclipping_mod reads the clipping norm from
CLIPPING_NORM_KEY = KEY_CLIPPING_NORM


@dataclass(frozen=True)
class ClusterDP:
    """The validated DP settings of one strategy."""

    noise_multiplier: float
    clipping_norm: float
    delta: float  # 0: no accounting (noise_multiplier is 0 then)

    def noise_std(self, replies: int) -> float:
        """Standard deviation of the noise on a cluster's average of ``replies`` clipped replies."""
        return compute_stdv(self.noise_multiplier, self.clipping_norm, replies)


def dp_settings(noise_multiplier: float, clipping_norm: float, delta: float) -> ClusterDP | None:
    """The DP settings, or None when DP is off (all three 0). ValueError, saying what to set,
    for noise without clipping or without δ."""
    if not (noise_multiplier or clipping_norm or delta):
        return None
    if noise_multiplier > 0 and clipping_norm <= 0:
        raise ValueError(f"dp_noise_multiplier = {noise_multiplier:g} without dp_clipping_norm: the noise is scaled "
                         f"to the clipping norm, so set dp_clipping_norm > 0 (the bound on each client's update)")
    if noise_multiplier > 0 and delta <= 0:
        raise ValueError(f"dp_noise_multiplier = {noise_multiplier:g} without dp_delta: the accountant reports ε at "
                         f"a δ; set dp_delta below 1/(number of clients), e.g. 1e-3 for 20 clients")
    if delta > 0 and noise_multiplier <= 0:
        raise ValueError(f"dp_delta = {delta:g} without dp_noise_multiplier: without noise ε is infinite; "
                         f"set dp_noise_multiplier > 0, or leave dp_delta at 0 for clipping only")
    return ClusterDP(float(noise_multiplier), float(clipping_norm), float(delta))


def check_population(dp: ClusterDP | None, clients: int) -> None:
    """ValueError when δ ≥ 1/clients: a mechanism that publishes one client's data outright
    with probability δ would meet such a guarantee."""
    if dp is not None and dp.delta > 0 and clients > 0 and dp.delta >= 1.0 / clients:
        raise ValueError(f"dp_delta = {dp.delta:g} is not below 1/n = {1.0 / clients:.3g} for n = {clients} clients: "
                         f"such a δ allows releasing one client's data outright; choose δ < 1/n "
                         f"(e.g. {1.0 / clients ** 2:.1g})")


def _floating(array: np.ndarray) -> bool:
    return np.issubdtype(np.asarray(array).dtype, np.floating)


def clip_replies(replies: list[TrainReply], clipping_norm: float) -> list[TrainReply]:
    """Clip each reply's update to L2 norm ``clipping_norm`` over its floating-point arrays
    (Flower's ``compute_clip_model_update``); its other arrays take the values it was sent.
    The replies are changed in place (later clustering steps read the clipped updates);
    returned are copies that weigh one each."""
    out = []
    for reply in replies:
        sent = reply.sent
        names = [n for n in reply.arrays if _floating(sent[n])]
        weights = reply.weights
        trained = [np.array(weights[n], copy=True) for n in names]
        base = [sent[n] for n in names]
        # Flower's clip divides by the norm: an update within the bound (a zero one too) is left as it is
        if get_norm([np.subtract(t, b, dtype=np.float64) for t, b in zip(trained, base)]) > clipping_norm:
            compute_clip_model_update(param1=trained, param2=base, clipping_norm=clipping_norm)
        clipped = {n: np.asarray(sent[n]).copy() for n in reply.arrays}
        clipped.update({n: np.asarray(a, dtype=np.asarray(sent[n]).dtype) for n, a in zip(names, trained)})
        reply.arrays = {n: difference(clipped[n], sent[n]) for n in clipped} if reply.is_update else clipped
        out.append(dataclasses.replace(reply, arrays=clipped, is_update=False, num_examples=1))
    return out


def secure_sensitivity(clipping_norm: float, settings: Any, model: Arrays) -> float:
    """The L2 sensitivity of a cluster's secure sum to one client's clipped update: the
    clipping norm plus the protocol's worst-case stochastic rounding of that client's values
    (each off by less than 2 r / steps: ``clusterfed.secagg``), over the model's floating values."""
    values = sum(int(np.size(a)) for a in model.values() if _floating(a))
    step = 2.0 * float(settings.clipping_range) / float(settings.quantization_range)
    return float(clipping_norm) + float(np.sqrt(values)) * step


def add_noise(model: Arrays, std: float, rng: np.random.Generator) -> Arrays:
    """``model`` with N(0, std²) noise on each floating-point array (in float64, cast back)."""
    if std <= 0:
        return model
    return {n: (np.asarray(a, np.float64) + rng.normal(0.0, std, np.shape(a))).astype(np.asarray(a).dtype)
            if _floating(a) else a for n, a in model.items()}


class Accountant:
    """ε at ``delta`` after ``releases`` noisy releases, from Flower's RDP accountant
    (no amplification by sampling: every release costs the same, so ε depends on the count)."""

    def __init__(self, dp: ClusterDP):
        if importlib.util.find_spec("dp_accounting") is None:  # before round 1, not at the first release
            raise ValueError('ε accounting (dp_noise_multiplier > 0) needs Flower\'s RDP accountant\'s backend, '
                             'dp-accounting: pip install "clusterfed[privacy]"')
        self.dp = dp
        self._epsilon: dict[int, float] = {0: 0.0}

    def epsilon(self, releases: int) -> float:
        if releases not in self._epsilon:
            accountant = RdpAccountant(PrivacyConfig(
                target_delta=self.dp.delta, population_size=1,  # no amplification: the size plays no part
                neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
                sampling_method=SamplingMethod.NO_AMPLIFICATION))
            accountant.compose(GaussianPrivacyEvent(self.dp.noise_multiplier, 1, 1), releases)
            self._epsilon[releases] = accountant.get_privacy_spent().epsilon
        return self._epsilon[releases]

    def report(self, releases: dict[str, int], assignment: dict[str, int],
               rounds: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
        """The run's ε (largest over clients) and each cluster's (largest over its members),
        with this round's per-cluster releases (``rounds``: cluster → sampled, noise_std)."""
        clusters: dict[str, dict[str, Any]] = {}
        members: dict[int, list[str]] = {}
        for key, cluster in assignment.items():
            members.setdefault(cluster, []).append(key)
        for cluster in sorted(members):
            row: dict[str, Any] = {"members": len(members[cluster]),
                                   "epsilon": self.epsilon(max(releases.get(k, 0) for k in members[cluster]))}
            if rounds and cluster in rounds:
                row.update(rounds[cluster])
                row["sampling_rate"] = round(rounds[cluster]["sampled"] / len(members[cluster]), 4)
            clusters[str(cluster)] = row
        most = max(releases.values(), default=0)
        return {"epsilon": self.epsilon(most), "delta": self.dp.delta, "noise_multiplier": self.dp.noise_multiplier,
                "clipping_norm": self.dp.clipping_norm, "max_releases": most, "accounting": "rdp, no amplification",
                "clusters": clusters}


def flower_dp_wrapper(frame: Any) -> str | None:
    """The class name of Flower's DP strategy wrapper if the caller (``frame``) is one."""
    caller = frame.f_locals.get("self") if frame is not None else None
    name = type(caller).__name__
    if caller is not None and type(caller).__module__.startswith("flwr.") and name.startswith("DifferentialPrivacy"):
        return name
    return None


def wrapper_refusal(wrapper: str, strategy: str) -> str:
    """Why Flower's DP wrapper cannot wrap a clustered strategy, and what to use instead."""
    return (f"Flower's {wrapper} cannot wrap the clustered strategy {strategy!r}: it clips every update against one "
            f"global model and adds noise to one aggregate, while {strategy!r} keeps a model per cluster. Use the "
            f"strategy's own DP instead, which clips each update against its cluster's model and noises each "
            f"cluster's average: {strategy}(dp_noise_multiplier=..., dp_clipping_norm=..., dp_delta=...) "
            f"(run config: dp-noise-multiplier, dp-clipping-norm, dp-delta); a ClientApp may keep "
            f"fixedclipping_mod (see docs/privacy.md)")
