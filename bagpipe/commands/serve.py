"""``bagpipe serve``: start one embedding server of a distributed job."""

from __future__ import annotations

import argparse

DESCRIPTION = """\
Start one embedding server: it holds the rows g with g % S == its shard (and their
optimizer state) on a memory or disk store, and serves the job's trainers until they
all finish. The row space (table sizes, D, seed) comes from trainer 0 at start-up, so
a server needs no dataset.

The server is rank --rank of a job of N trainers + S servers + 1 oracle (servers are
ranks N .. N+S-1) and meets the others at --master-addr:--master-port ($WORLD_SIZE, if
set, must be N + S + 1). It talks over the interface that holds --bind, 127.0.0.1
unless you give another address. A rendezvous that fails before --rendezvous-timeout
(the job's rank 0 stopped) is reported at once, with how long it took.

Example (the other roles started with torchrun / bagpipe worker, see docs/distributed.md):
  bagpipe serve --rank 2 --trainers 2 --servers 2 --master-addr 10.0.0.1 \\
      --bind 10.0.0.7 --secret-file job.secret --store disk --store-dir /nvme/bagpipe-shard

Every role of the job must hold the same secret (a file of mode 0600 or
$BAGPIPE_JOB_SECRET); a role that cannot prove it holds it is refused.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    # $RANK, $MASTER_ADDR and $MASTER_PORT are read by run(), not here: a bad value in the
    # environment must not break the parsing of every command (--version, --help)
    from bagpipe.config.argtypes import count, path, real, text

    p.add_argument("--rank", type=count(0), help="this process's rank (default $RANK)")
    p.add_argument("--trainers", type=count(1, 4096), required=True, help="N trainers in the job")
    p.add_argument("--servers", type=count(1, 4096), required=True, help="S servers in the job")
    p.add_argument("--master-addr", type=text, help="rendezvous host (default $MASTER_ADDR or 127.0.0.1)")
    p.add_argument("--master-port", help="rendezvous port, 1..65535 (default $MASTER_PORT or 29500)")
    p.add_argument("--bind", default="127.0.0.1", help="address of the interface to serve on (default 127.0.0.1)")
    p.add_argument(
        "--store", choices=("memory", "disk"), default="memory", help="where the shard's rows live (default memory)"
    )
    p.add_argument("--store-dir", type=path, help="directory of the disk store (a shard-K-of-S folder is made in it)")
    p.add_argument("--threads", type=count(1, 4096), default=1, help="torch threads (default 1)")
    p.add_argument(
        "--rendezvous-timeout",
        type=real(0, lo_open=True),
        default=300.0,
        metavar="SECONDS",
        help="how long to wait for the job's other processes to start (default 300)",
    )
    p.add_argument(
        "--memory-budget-mb",
        type=real(0),
        default=None,
        metavar="MIB",
        help="MiB this server may use, page cache included (default: its memory cgroup's limit; 0: none); "
        "its disk store's I/O bounds are sized to it, and a shard that does not fit is refused before serving",
    )
    p.add_argument(
        "--secret-file",
        metavar="FILE",
        help="file (mode 0600) holding the job's secret, the same on every role (default $BAGPIPE_JOB_SECRET, "
        "else the file named by $BAGPIPE_JOB_SECRET_FILE)",
    )
    p.add_argument(
        "--init-from-store",
        action="store_true",
        help="start from the rows --store-dir already holds (otherwise a non-empty store is refused)",
    )


def run(args: argparse.Namespace) -> int:
    import os

    from bagpipe.config.environ import MAX_PORT, env_int, parse_int
    from bagpipe.distributed.launch import interface_of
    from bagpipe.distributed.layout import Layout
    from bagpipe.distributed.roles import ServerConfig, check_world_size, serve
    from bagpipe.errors import ConfigError

    if args.store_dir == "-":  # the command line's name for standard output
        raise ConfigError("--store-dir -: the disk store is a folder, not standard output; give a folder")
    layout = Layout(args.trainers, args.servers)
    check_world_size(layout)  # the job's size is --trainers + --servers + 1: another WORLD_SIZE is refused
    rank: int = args.rank if args.rank is not None else env_int("RANK", -1, lo=0, hi=layout.world_size - 1)
    if rank < 0:
        raise ConfigError("--rank is required (or $RANK): servers are ranks N .. N+S-1")
    if args.master_port is not None:
        master_port = parse_int(args.master_port, "--master-port", lo=1, hi=MAX_PORT)
    else:
        master_port = env_int("MASTER_PORT", 29500, lo=1, hi=MAX_PORT)
    master_addr = args.master_addr or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    iface = interface_of(args.bind)
    if iface is None:
        raise ConfigError(f"--bind {args.bind}: no network interface of this machine has that address")
    if args.store == "disk" and not args.store_dir:
        raise ConfigError("--store disk needs --store-dir")
    scfg = ServerConfig(
        store=args.store,
        store_dir=args.store_dir,
        threads=args.threads,
        rendezvous_timeout=args.rendezvous_timeout,
        init_from_store=args.init_from_store,
        memory_budget_mb=args.memory_budget_mb,
        secret_file=args.secret_file,
    )
    os.environ.update(
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
        RANK=str(rank),
        WORLD_SIZE=str(layout.world_size),
        GLOO_SOCKET_IFNAME=iface,
    )
    serve(scfg, layout, rank)
    return 0
