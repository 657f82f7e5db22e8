"""How much group signal small clients carry: FedClust's clustering-round vectors per client,
captured from a one-round run, then the silhouette of the true groups, the auto cut and the
group-free reference for L2 and cosine (benchmarks/results/small_client_defaults/signal_400.txt).

    PYTHONPATH=$PWD python benchmarks/archive/scripts/small_client_signal.py capture OUT.npz CLIENTS SETTING [DATASET]
    PYTHONPATH=$PWD python benchmarks/archive/scripts/small_client_signal.py analyse OUT.npz [...]

SETTING: rotation, pairs or iid; DATASET: mnist (default, data-dir ../shared/data) or digits.
"""

import sys

import numpy as np
from sklearn.metrics import adjusted_rand_score, silhouette_score
from sklearn.metrics.pairwise import cosine_distances, euclidean_distances

from clusterfed.clustering.agglomerative import cluster_auto
from clusterfed.config import parse_config
from clusterfed.simulation import simulate
from clusterfed.strategies.oneshot import OneShotClustering

SETTINGS = {"rotation": {"partitioner": "rotation", "rotations": "0,90,180,270"},
            "pairs": {"partitioner": "label-groups", "label-groups": "0,1;2,3;4,5;6,7;8,9"},
            "iid": {"partitioner": "iid"}}


def capture(out: str, clients: int, setting: str, dataset: str = "mnist") -> None:
    store = {}
    form = OneShotClustering.form_clusters

    def record(self, server_round, keys, X, labels, start, bytes_up, info):
        store.update(X=X.copy(), groups=[self.clients[k].true_group for k in keys])
        return form(self, server_round, keys, X, labels, start, bytes_up, info)

    OneShotClustering.form_clusters = record
    values = {"num-clients": clients, "rounds": 1, "seed": 0, **SETTINGS[setting], "strategy": "fedclust",
              "dataset": dataset, "data-dir": "../shared/data", "checkpoint": False,
              "out-dir": f"/tmp/small_client_signal/{setting}_{clients}"}
    simulate(parse_config(values), engine="inprocess", stream=None)
    np.savez(out, X=store["X"], groups=np.array(store["groups"]))


def analyse(path: str) -> None:
    data = np.load(path)
    X, groups = data["X"], data["groups"]
    for metric in ("l2", "cosine"):
        D = euclidean_distances(X) if metric == "l2" else cosine_distances(X)
        np.fill_diagonal(D, 0)
        same, off = groups[:, None] == groups[None, :], ~np.eye(len(groups), dtype=bool)
        true = silhouette_score(D, groups, metric="precomputed") if len(set(groups)) > 1 else None
        ratio = D[same & off].mean() / D[~same].mean() if len(set(groups)) > 1 else None
        cut = cluster_auto(X, metric=metric, reference_draws=19)
        print(len(X), path, metric, true, ratio, cut.num_clusters, cut.silhouette, cut.reference,
              adjusted_rand_score(groups, cut.labels))


if __name__ == "__main__":
    if sys.argv[1] == "capture":
        capture(sys.argv[2], int(sys.argv[3]), sys.argv[4], *sys.argv[5:])
    else:
        for p in sys.argv[2:]:
            analyse(p)
