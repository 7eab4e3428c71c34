"""``bagpipe worker``: one role of a distributed job (started by the launcher or torchrun)."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Run one role of a distributed job: the rank in $RANK decides which (ranks 0..N-1
trainers, N..N+S-1 embedding servers, N+S the oracle). The rendezvous comes from
$MASTER_ADDR, $MASTER_PORT and $WORLD_SIZE, as torchrun sets them. Every process of
the job gets the same options (those of `bagpipe train`, with --trainers/--servers).

`bagpipe train --trainers N --servers S` starts all roles on this machine for you.
Across machines, with torchrun on each (N + S + 1 processes in total):

  torchrun --nnodes 2 --nproc-per-node 3 --node-rank 0 \\
      --rdzv-backend static --master-addr HOST0 --master-port 29500 \\
      -m bagpipe.cli worker --data /shared/data --out /shared/runs/a \\
      --mode lookahead --trainers 2 --servers 3 --steps 1000

(and --node-rank 1 on the second machine). Set GLOO_SOCKET_IFNAME to the interface
the roles should talk over. See docs/distributed.md.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bagpipe.commands.train import add_arguments as train_arguments
    from bagpipe.config.argtypes import path

    p.add_argument(
        "--job", type=path, help="JSON of the whole configuration (written by the launcher); replaces the options below"
    )
    p.add_argument(
        "--standby",
        action="store_true",
        help="a spare of the local launcher: import everything a role needs, then wait for a line on stdin "
        'naming the role ({"job": FILE, "env": {...}}); a restart then starts no interpreter',
    )
    train_arguments(p)


def run(args: argparse.Namespace) -> int:
    import json
    import os
    import sys

    import bagpipe.phases as phases
    from bagpipe.config import given
    from bagpipe.config.train import TrainConfig, load_config
    from bagpipe.device.placement import local_rank
    from bagpipe.distributed.layout import Layout
    from bagpipe.distributed.roles import env_rank, import_role_modules, report_error, run_role
    from bagpipe.errors import BagpipeError

    if args.standby:  # a pre-started spare: everything imported before it is needed
        import_role_modules()
        line = sys.stdin.readline()
        if not line.strip():  # the launcher is done with its spares
            return 0
        assignment = json.loads(line)
        os.environ.update(assignment["env"])
        args.job = assignment["job"]
        phases.mark("started", fresh=True)
    else:
        phases.mark("started", fresh=True)
        import_role_modules()
    phases.mark("imported")
    if args.job:
        from bagpipe.data.schema import read_json

        cfg = TrainConfig.from_json(read_json(args.job), source=args.job)
    else:  # a role started by hand: the checks `bagpipe train` makes before it launches its roles
        from bagpipe.commands.train import check_out_folders, check_summary_json

        cfg = load_config(args.config, given(args, TrainConfig))
        check_out_folders(cfg)
        check_summary_json(cfg)
    layout = Layout(cfg.dist.trainers, cfg.dist.servers)
    rank = env_rank(layout)
    local_rank()  # LOCAL_RANK checked now, not when the trainer picks its GPU after the join
    try:
        summary = run_role(cfg, layout, rank)
    except BagpipeError as e:
        # A role that lost a peer may still have threads blocked inside gloo on that
        # peer; the interpreter's normal teardown would then abort in C++. Report and
        # leave at once: this process has nothing left to save.
        report_error(e)
        sys.stdout.flush()
        os._exit(2)
    if summary is not None:
        from bagpipe.commands.train import summary_line

        print(summary_line(summary), flush=True)
    return 0
