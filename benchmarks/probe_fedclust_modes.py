"""FedClust at N clients with ``client-batching`` off and auto, each run's record kept: why the
two modes can end with different clusters, and where a batched round's server time goes.

    OUT=benchmarks/results/batched-clients/gpu-fedclust-1000 \\
        PYTHONPATH=$PWD python benchmarks/probe_fedclust_modes.py 1000 DATA_DIR off,auto

The setting is ``bench_batched_clients.py``'s (MNIST rotation, ``mnist-cnn``, 3 rounds, seed 0).
Per mode, ``fedclust-N-MODE.tgz`` under ``$OUT`` holds the run's ``rounds.jsonl`` (each round's
decisions in words), ``clusters.json``, ``summary.json`` and ``config.json``; the batched run
also ``profile-cumulative.txt`` and ``profile-tottime.txt`` (cProfile's top 45 functions).
``probe.json``: torch's threads and TF32 flags, and each run's wall and CPU seconds. Written
for a device machine, where only what lies under ``$OUT`` comes back.
"""

import cProfile
import io
import json
import os
import pstats
import sys
import tarfile
import time
from pathlib import Path

out = Path(os.environ.get("OUT", "/tmp/probe-out"))
out.mkdir(parents=True, exist_ok=True)
clients, data_dir = int(sys.argv[1]), sys.argv[2]
import torch  # noqa: E402 - after the arguments: a wrong call fails before torch loads

from clusterfed.config import parse_config  # noqa: E402
from clusterfed.experiments.settings import setting  # noqa: E402
from clusterfed.simulation import simulate  # noqa: E402

info = {"torch_threads": torch.get_num_threads(), "cuda": torch.cuda.is_available(),
        "cudnn_tf32": torch.backends.cudnn.allow_tf32, "matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
        "env": {k: v for k, v in os.environ.items() if "THREAD" in k}}
print(json.dumps(info), flush=True)
runs = {}
for mode in sys.argv[3].split(","):
    d = Path("/tmp/probe-runs") / f"fedclust-{clients}-{mode}"
    values = {**setting("mnist-rotation"), "data-dir": data_dir, "model": "mnist-cnn", "num-clients": clients,
              "rounds": 3, "seed": 0, "strategy": "fedclust", "checkpoint": False, "log-to": "none",
              "client-batching": mode, "out-dir": str(d)}
    prof = cProfile.Profile()
    t = time.perf_counter()
    c = time.process_time()
    if mode == "auto":
        prof.enable()
    simulate(parse_config(values), engine="inprocess", stream=sys.stdout)
    prof.disable()
    runs[mode] = {"wall": time.perf_counter() - t, "cpu": time.process_time() - c}
    for key in (("cumulative", "tottime") if mode == "auto" else ()):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(45)
        (d / f"profile-{key}.txt").write_text(s.getvalue())
    print(json.dumps({mode: runs[mode]}), flush=True)
    with tarfile.open(out / f"fedclust-{clients}-{mode}.tgz", "w:gz") as tar:
        tar.add(d, arcname=d.name,
                filter=lambda t: None if t.name.endswith((".png", "/models")) or "/models/" in t.name else t)
(out / "probe.json").write_text(json.dumps({**info, "runs": runs}, indent=1))
