"""benchmarks/bench_batched_clients.py: the README names the runs whose two modes ended apart."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from bench_batched_clients import modes_disagree, speedups, write_readme  # noqa: E402


def _row(strategy, mode, clusters, ari, seconds=1.0, clients=1000):
    return {"clients": clients, "strategy": strategy, "client_batching": mode, "num_clusters": clusters,
            "final_ari": ari, "steady_round_seconds": seconds, "clients_per_second": clients / seconds,
            "cpu_seconds_per_round": seconds, "server_share": 0.1, "chunks": 0, "largest_chunk": 0,
            "peak_gpu_bytes_per_chunk": 0, "final_accuracy": 0.5}


def test_runs_whose_modes_end_with_other_clusters_are_named(tmp_path):
    results = [_row("fedavg", "off", 1, 0.0, 4.0), _row("fedavg", "auto", 1, 0.0, 2.0),
               _row("fedclust", "off", 1, 0.0), _row("fedclust", "auto", 5, 0.91),
               _row("cfl", "off", 1, 0.0), {"clients": 1000, "strategy": "cfl", "client_batching": "auto",
                                            "error": "OutOfMemoryError: CUDA"}]
    assert modes_disagree(results) == ["fedclust-1000 (off: 1 cluster, ARI 0.00; auto: 5 clusters, ARI 0.91)"]
    assert speedups(results) == {"fedavg-1000": 2.0, "fedclust-1000": 1.0}
    write_readme(tmp_path, {"command": "c", "device": "NVIDIA H200 (CUDA), 16 CPU cores", "results": results,
                            "speedup": speedups(results)})
    text = (tmp_path / "README.md").read_text()
    assert "ended with different clusters: fedclust-1000" in text
    assert "OutOfMemoryError" in text


def test_runs_that_agree_say_nothing(tmp_path):
    results = [_row("fedclust", "off", 4, 0.96), _row("fedclust", "auto", 4, 0.96, 0.5)]
    assert modes_disagree(results) == []
    write_readme(tmp_path, {"command": "c", "device": "no GPU: x, 2 cores", "results": results,
                            "speedup": speedups(results)})
    assert "different clusters" not in (tmp_path / "README.md").read_text()
