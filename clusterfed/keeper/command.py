"""``clusterfed keep``: the run keeper on a host (the compose service runs the same command)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from clusterfed.keeper.decide import Policy
from clusterfed.keeper.flower import FlwrCli, app_config, connection_home
from clusterfed.keeper.loop import Keeper


def add_parser(sub) -> None:
    keep = sub.add_parser(
        "keep", help="start a deployed run and keep it going: relaunch it (resume-from=\"auto\") when it fails or stalls",
        description="Runs `flwr run APP CONNECTION --run-config ... resume-from=\"auto\"`, watches the run through "
                    "Flower's Control API and out-dir, relaunches it when Flower marks it failed or no round comes "
                    "for STALL_MULTIPLE x the run's timeout, and writes out-dir/status.json (starting, running, "
                    "stalled, resuming, failed, finished, with the reason). Exit status 0 when the run finished, "
                    "1 when the keeper gave up.")
    keep.add_argument("app", help="the Flower app's folder (holding pyproject.toml), as for `flwr run`")
    keep.add_argument("connection", help="a connection in $FLWR_HOME/config.toml, as for `flwr run`; with "
                                         "--superlink, the name given to the connection the keeper writes")
    keep.add_argument("--run-config", default="", help="as for `flwr run` (resume-from=\"auto\" is added)")
    keep.add_argument("--out", help="the run's out-dir as this host sees it (default: the run config's out-dir, "
                                    "relative to APP)")
    keep.add_argument("--superlink", help="HOST:PORT: write a connection of its own (in a fresh $FLWR_HOME) "
                                          "instead of reading $FLWR_HOME/config.toml")
    keep.add_argument("--root-certificates", help="with --superlink: the CA certificate (else insecure)")
    keep.add_argument("--poll", type=float, default=10.0, help="seconds between looks at the run (10)")
    keep.add_argument("--stall-multiple", type=float, default=4.0,
                      help="no new round for this many x timeout (plus wait-timeout before a (re)started run's "
                           "first round) means stalled (4)")
    keep.add_argument("--start-timeout", type=float, default=300.0,
                      help="seconds Flower may take to start a launched run (300)")
    keep.add_argument("--backoff", type=float, default=10.0,
                      help="seconds before the first relaunch, doubled for each further one in a row (10)")
    keep.add_argument("--backoff-max", type=float, default=300.0, help="the longest wait between relaunches (300)")
    keep.add_argument("--max-retries", type=int, default=5,
                      help="relaunches in a row without a new round before giving up (5)")
    keep.add_argument("--flwr", default="flwr", help="the flwr command (default: flwr on PATH)")
    keep.set_defaults(func=cmd_keep)


def cmd_keep(args: argparse.Namespace) -> int:
    app = Path(args.app).resolve()
    config = app_config(app, args.run_config)
    out = Path(args.out) if args.out else app / str(config.get("out-dir", "results/run"))
    policy = Policy(rounds=int(config.get("rounds", 1)), round_timeout=float(config.get("timeout", 600.0)),
                    wait_timeout=float(config.get("wait-timeout", 300.0)), stall_multiple=args.stall_multiple,
                    start_timeout=args.start_timeout, backoff=args.backoff, backoff_max=args.backoff_max,
                    max_retries=args.max_retries)
    env = dict(os.environ)
    if args.superlink:
        home = connection_home(tempfile.mkdtemp(prefix="clusterfed-keeper-"), args.connection, args.superlink,
                               args.root_certificates)
        env["FLWR_HOME"] = str(home)
    flower = FlwrCli(str(app), args.connection, args.run_config, flwr=args.flwr, env=env)
    print(f"keeper: {config.get('rounds')} rounds, timeout {policy.round_timeout:g} s, stalled after "
          f"{policy.stall_seconds(False):g} s without a round; status in {out / 'status.json'}", flush=True)
    return Keeper(flower, out, policy, log=lambda line: print(line, file=sys.stderr, flush=True)).run(args.poll)
