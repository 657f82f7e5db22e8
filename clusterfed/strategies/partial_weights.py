"""The clustering phase's upload of the one-shot strategies (FedClust, AdaCFL): clients
train a common start model and send only the compared layer(s); the server turns the
replies into one row per client.

Choices the papers leave open:

- Rows are the partial weights minus the start model's (what training changed). For L2
  that is exactly the papers' distance between weights; for ``cosine`` it compares
  directions of training rather than weight vectors dominated by the shared start.
- A stock ClientApp (no profile query) trains its own run config's ``local-epochs`` and
  ignores the message's: unless its reply confirms the epochs asked (a ``local-epochs``
  metric), it is sent its own reply back until it has trained ``cluster-epochs``
  (``chain-until = epochs``) or until the clustering of the replies stops changing
  (``chain-until = stable``), so its row is as trained as a helper client's.
- Clients whose reply is lost or rejected stay unplaced and are admitted again later.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Callable

import numpy as np
from sklearn.metrics import adjusted_rand_score

from clusterfed.strategies.exchange import UPLOAD_FULL, Arrays, Steps, TrainReply, natural
from clusterfed.strategies.layer_choice import LayerChoice, choose, sentence, start_choice
from clusterfed.strategies.oneshot import OneShotHost, OneShotPart

# a cut of rows: (labels, what the cut used), as ``OneShotClusters.cut`` gives them
Cut = Callable[[np.ndarray], tuple[np.ndarray, dict[str, Any]]]


class PartialWeights(OneShotPart):
    """Collects the clustering phase's partial weights for ``strategy`` (a part it builds);
    ``paper_rule`` is the layer rule of its paper (what ``cluster-layers = auto`` falls back
    to on a model with no candidate layer), ``cut`` how the stability check cuts rows."""

    def __init__(self, strategy: OneShotHost, paper_rule: str, cut: Cut) -> None:
        super().__init__(strategy)
        self.paper_rule = paper_rule
        self.cut = cut

    def start(self) -> None:
        """The layer choice before any reply (``layer_choice.start_choice``)."""
        s = self.host
        self.state.layer_choice = start_choice(self.state.theta0, self.params.cluster_layers, s.compared_names(),
                                               s.select_compared_layers, self.paper_rule,
                                               max_candidates=self.params.max_candidate_layers)

    @property
    def keys(self) -> list[str]:
        """The arrays uploaded and compared now."""
        return self.state.layer_choice.keys

    def collect(self, server_round: int, keys: list[str], start: Arrays) -> Steps:
        """Train ``start`` on each of ``keys`` for ``cluster-epochs`` and fetch only the
        selected layer(s). Returns (keys that replied, their partial weights as rows, the
        uplink bytes of this phase, its diagnostics). Clients whose reply was lost or rejected
        stay unplaced and are admitted again next round.

        A stock ClientApp trains its run config's ``local-epochs`` whatever the message asks
        and returns its whole model: unless its reply confirms the epochs asked (a
        ``local-epochs`` metric equal to them), it is sent its own reply back until it has
        trained ``stock_requests()`` times in all, so that its rows are as trained as the
        others'."""
        epochs = self.params.cluster_epochs
        extra = {"local-epochs": epochs, "upload": ",".join(self.keys)}
        asks = self.host.train_asks(server_round, keys, models={key: start for key in keys}, extra=extra,
                                        phase="cluster")
        for ask in asks:
            if self.host.clients[ask.key].stock:  # it sends its whole model anyway; the next request needs it
                ask.config["upload"] = UPLOAD_FULL
        received = yield asks
        bytes_up = received.bytes_up
        done, replies = [], []  # trained the epochs asked / to be sent their own reply back
        for reply in received:
            (done if self.trains_on(reply, epochs) else replies).append(reply)
        chained, requests, partitions = 0, 1, []
        for _ in range(self.stock_requests() - 1):
            if not replies or (self.params.chain_until == "stable" and self.settled(done + replies, start, partitions)):
                break
            received = yield self.host.train_asks(server_round, [reply.key for reply in replies],
                                                      models={reply.key: reply.weights for reply in replies},
                                                      extra={**extra, "upload": UPLOAD_FULL}, phase="cluster")
            bytes_up += received.bytes_up
            chained += len(replies)
            requests += 1
            replies = list(received)  # a client that fails on the way stays unplaced
        diagnostics = {"stock_chained_requests": chained, "stock_trainings": requests} if chained else {}
        replies = sorted(done + replies, key=lambda reply: natural(reply.key))
        if not replies:
            return [], None, bytes_up, diagnostics
        # rows in layer order, so every client's vector lines up (measured on digits IID:
        # cosine on weights split 2 of 4 seeds, on changes none)
        first_choice = not self.state.layer_choice.decided
        X = self.rows(replies, start)
        if first_choice:
            diagnostics["decision"] = sentence(self.state.layer_choice, type(self.host).__name__)
            diagnostics["compared_arrays"] = list(self.keys)
        return [reply.key for reply in replies], X, bytes_up, diagnostics

    def rows(self, replies: list[TrainReply], start: Arrays, choice: LayerChoice | None = None) -> np.ndarray:
        """The replies' compared arrays minus ``start``'s, one row per reply; the first time,
        this settles which layer is compared (``layer_choice.choose``; on ``choice``, a trial
        copy, when given)."""
        p = self.params
        return choose(self.state.layer_choice if choice is None else choice, [reply.arrays for reply in replies],
                      start, metric=p.distance, linkage=p.linkage, min_silhouette=p.auto_min_silhouette,
                      reference_draws=p.auto_reference_draws, seed=p.seed)

    def settled(self, replies: list[TrainReply], start: Arrays, partitions: list[np.ndarray]) -> bool:
        """Whether the clustering of ``replies`` (cut as ``cut`` would, on a copy of the layer
        choice) is the same as after the two requests before, with more than one cluster
        and a silhouette at ``auto-min-silhouette``: a stock client's further epochs would not
        change it (``chain-until = stable``)."""
        p = self.params
        labels, info = self.cut(self.rows(replies, start, choice=copy.deepcopy(self.state.layer_choice)))
        partitions.append(np.asarray(labels))
        if len(partitions) < 3 or len(np.unique(labels)) < 2:
            return False
        # a cut that only beats group-free data (the lowered bar) may still move: only clear
        # structure, at the fixed bar, ends the chain early
        if p.lambda_ == "auto" and (info.get("auto_best_silhouette") or -1.0) < p.auto_min_silhouette:
            return False
        return all(adjusted_rand_score(partitions[-1], earlier) == 1.0 for earlier in partitions[-3:-1])

    def trains_on(self, reply: TrainReply, epochs: int) -> bool:
        """Whether ``reply`` trained the clustering step's ``epochs`` in one request: a
        clusterfed client does; a stock ClientApp only when it says so (``local-epochs``)."""
        return not self.host.clients[reply.key].stock or reply.metrics.get("local-epochs") == epochs

    def stock_requests(self) -> int:
        """Requests that give a stock ClientApp the clustering step's epochs: it trains its
        run config's ``local-epochs`` per request, which the server reads from its own train
        config (Flower's quickstart default, 1, when absent)."""
        per_request = max(int(self.host.train_config.get("local-epochs", 1) or 1), 1)
        return math.ceil(self.params.cluster_epochs / per_request)
