"""`ray start ARGS...` with every Ray address kept on 127.0.0.1 (test scaffolding for
benchmarks/ray_cluster.sh only; a real cluster uses plain `ray start`).

Ray 2.55 replaces 127.0.0.1 in `--address` / `--node-ip-address` with the machine's
routable IP (ray/_private/services.py: resolve_ip_for_localhost -> get_node_ip_address),
unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which keeps the loopback IP but also makes
`ray start --address=...` (a worker node) abort with "Multi-node Ray clusters are not
supported on Windows and OSX" (ray/scripts/scripts.py). Run with that variable at 0 (so
every process Ray spawns stays on loopback), this wrapper lets the worker-node start through
and pins this process's own node-IP detection to 127.0.0.1.
"""
import os
import sys

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

from ray._private import ray_constants, services  # noqa: E402

ray_constants.ENABLE_RAY_CLUSTER = True  # let a worker node join (the check in scripts.py)
services.get_node_ip_address = lambda address=None: "127.0.0.1"

from ray.scripts.scripts import main  # noqa: E402

sys.argv = ["ray", "start", *sys.argv[1:]]
sys.exit(main())
