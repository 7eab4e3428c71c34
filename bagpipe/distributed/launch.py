"""The local launcher: every role of a distributed job as a process on loopback.

``bagpipe train --trainers N --servers S ...`` lands here. It picks a free port,
starts N + S + 1 ``bagpipe worker`` processes (the same entry ``torchrun`` starts
across machines), prefixes each line they print with the role (``[server 1]``) and
keeps a log per role under RUN/logs/. The first role to fail stops the job: the
launcher names it (a role the kernel's OOM killer ended: with the roles' cgroup's peak
and limit; roles are made the OOM killer's first choice, so the launcher lives to say it), stops every other role (SIGTERM, then SIGKILL after a grace
period) and returns an error. Ctrl-C, SIGTERM and SIGHUP stop every role the same way
(SIGINT even where the launcher inherited it ignored: ``cmd &`` in a script), and one
line says where the run can continue, as a stopped one-process run does. RUN/roles.json
lists the roles' ranks and pids while the job runs. A launcher killed outright (SIGKILL)
stops nothing itself: each role it started ends when it sees the launcher gone
(:mod:`bagpipe.lifeline`), and holds the run folder's lock until then.

This module is long because it also holds the restart loop and the pre-started spares
(:class:`Spares`), which share the launcher's process handling.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bagpipe import lifeline
from bagpipe.checkpoint import CheckpointFolder, Manifest
from bagpipe.checkpoint.folder import stopped_by, where_to_continue
from bagpipe.config.train import TrainConfig
from bagpipe.distributed.auth import SECRET_ENV, load_secret, new_secret
from bagpipe.distributed.layout import Layout, role_threads
from bagpipe.distributed.roles import ERROR_PREFIX
from bagpipe.errors import BagpipeError, ConfigError
from bagpipe.files import atomic_write_text, held_lock_fds
from bagpipe.jsonout import json_text
from bagpipe.phases import ENV as PHASES_ENV
from bagpipe.phases import RESTART_ENV
from bagpipe.store import holds_store
from bagpipe.train.preflight import memory_checks, preflight
from bagpipe.train.resume import finished
from bagpipe.train.rundir import LOCK_HELD_ENV, RunDir

log = logging.getLogger(__name__)

STOP_GRACE_S = 10.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def interface_of(address: str) -> str | None:
    """Name of the network interface that holds ``address`` (gloo binds to an interface)."""
    try:
        import psutil
    except ImportError:  # a bare GPU machine may lack it (make gpu-check installs nothing)
        return _ipv4_interface_of(address)
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == address for a in addrs):
            return name
    return None


def _ipv4_interface_of(address: str) -> str | None:
    """:func:`interface_of` without psutil: each interface's IPv4 address from Linux's
    SIOCGIFADDR ioctl (an interface's first address only)."""
    import fcntl
    import struct

    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address
                continue
            if socket.inet_ntoa(packed[20:24]) == address:
                return name
    return None


def role_env(
    layout: Layout,
    rank: int,
    master_addr: str,
    master_port: int,
    threads: int,
    run_dir: Path | None = None,
    secret: bytes | None = None,
) -> dict:
    """The environment of one role: torchrun's variables, loopback-only gloo, and the
    job's ``secret`` (in the environment: never on a command line, never in a file)."""
    env = dict(os.environ)
    if secret is not None:
        env[SECRET_ENV] = secret.decode()
    env.update(
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),  # one machine: trainer i takes GPU i on --device cuda (bagpipe.device.placement)
        WORLD_SIZE=str(layout.world_size),
        OMP_NUM_THREADS=str(threads),
        PYTHONUNBUFFERED="1",
    )
    if run_dir is not None:
        env[LOCK_HELD_ENV] = str(Path(run_dir).resolve())
    iface = interface_of(master_addr)
    if iface:
        env["GLOO_SOCKET_IFNAME"] = iface
    return env


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


@dataclass(frozen=True)
class Placement:
    """Where each role runs when not every role is a process on this machine's loopback
    (``bagpipe bench cluster``: each role in a network namespace of its own).

    Attributes:
        master_addr: the rendezvous, trainer 0's address.
        prefix: the command prefix that runs a rank's process where it belongs (e.g.
            ``ip netns exec NS``).
        iface: the interface gloo binds to (GLOO_SOCKET_IFNAME) in every role's host.
        port: the rendezvous port (each host has its own ports: no need to find a free one).
    """

    master_addr: str
    prefix: Callable[[int], list[str]]
    iface: str
    port: int = 29500


@dataclass
class Role:
    rank: int
    name: str
    proc: subprocess.Popen
    log_path: Path
    pump: threading.Thread | None = None


#: An error that only follows another role's (it lost contact with the one that stopped).
SECONDARY = " lost contact with "
#: Seconds the launcher waits, after a role exits with an error that names no cause of its
#: own, for the exit of the role it may have lost (a role killed by a signal says nothing).
LOST_CONTACT_WAIT_S = 1.0


class RoleFailed(BagpipeError):
    """A role of the job exited with an error (the launcher stopped the others).

    ``reason``: the one line the role that stopped first printed (its own refusal, e.g.
    ``cannot resume ...``), when one did; roles that only lost contact with it are not
    the cause and are not named. ``times``: when it was reaped (``died``), when the
    launcher acted (``noticed``), when every other role was gone (``stopped``),
    wall-clock seconds."""

    def __init__(
        self,
        name: str,
        rank: int,
        code: int,
        stopped: int,
        log_path: Path,
        reason: str | None = None,
        times: dict | None = None,
    ):
        self.name, self.rank, self.code, self.reason = name, rank, code, reason
        self.times = times or {}
        why = f": {reason}" if reason else f" ({describe_exit(code)})"
        super().__init__(f"{name} (rank {rank}) failed{why}; stopped {stopped} other role(s); its log: {log_path}")


class Launcher:
    """Starts, watches and stops the roles of one job (see the module docstring)."""

    def __init__(
        self,
        cfg: TrainConfig,
        stop_grace_s: float = STOP_GRACE_S,
        restart: int = 0,
        spares: Spares | None = None,
        placement: Placement | None = None,
    ):
        self.cfg = cfg
        self.restart = restart  # 0: the first attempt; n: the n-th restart after a failure
        self.spares = spares if placement is None else None  # spares run on this host only
        self.placement = placement
        self.layout = Layout(cfg.dist.trainers, cfg.dist.servers)
        self.grace = stop_grace_s
        self.out = Path(cfg.run.out)
        self.roles: list[Role] = []
        self._events: queue.Queue = queue.Queue()
        self._echo_lock = threading.Lock()
        self._errors: list[tuple[Role, str]] = []  # (role, its error line), in the order they were printed
        # the memory cgroup the roles share, and its OOM kills so far: a role killed by the
        # kernel's OOM killer prints nothing, the launcher says so (:meth:`_oom_reason`)
        from bagpipe.budget.cgroup import own_group

        self._group = own_group() if placement is None else None
        self._ooms = self._group.oom_kills() if self._group is not None else None

    def _say(self, line: str) -> None:
        with self._echo_lock:  # the roles' reader threads: one line at a time
            log.info(line)

    def start(self) -> None:
        """Start every role; the caller holds the run folder's lock and has checked
        what the run may do in it (see :func:`launch`)."""
        logs = self.out / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        phases_dir = self.out / ".phases"  # each role's start-up marks (bagpipe.phases)
        phases_dir.mkdir(exist_ok=True)
        job = self.out / "job.json"
        job.write_text(json_text(self.cfg.to_json(), indent=2))
        place = self.placement
        port = place.port if place else free_port()
        # a new secret for every attempt (unless the job names a file): a role of an earlier attempt cannot join
        secret = None if self.cfg.dist.secret_file else new_secret()
        in_spares = 0
        for rank in range(self.layout.world_size):
            name = self.layout.name(rank)
            threads = role_threads(self.cfg.run.threads, self.layout, rank, environ={})
            log_path = logs / f"{name.replace(' ', '-')}.log"
            env = role_env(
                self.layout, rank, place.master_addr if place else "127.0.0.1", port, threads, self.out, secret
            )
            if place:
                env["GLOO_SOCKET_IFNAME"] = place.iface
            env[PHASES_ENV] = str(phases_dir)
            env[lifeline.ENV] = lifeline.token()  # the role ends when this launcher is gone, even by SIGKILL
            env[lifeline.LOG_ENV] = str(log_path)  # where it says so (no launcher reads its output then)
            if self.restart:
                env[RESTART_ENV] = str(self.restart)
            spare = self.spares.take() if self.spares is not None else None
            in_spares += spare is not None
            if spare is not None:  # a pre-started interpreter, its imports done: it becomes this role
                proc = spare
                assert proc.stdin is not None
                proc.stdin.write((json.dumps({"job": str(job), "env": env}, allow_nan=False) + "\n").encode())
                proc.stdin.close()
            else:
                proc = subprocess.Popen(
                    [
                        *(place.prefix(rank) if place else []),
                        sys.executable,
                        "-m",
                        "bagpipe.cli",
                        "worker",
                        "--job",
                        str(job),
                    ],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # Ctrl-C reaches the launcher only; it stops the roles itself
                    pass_fds=held_lock_fds(),  # the run folder's lock stays held while any role lives
                )
            role = Role(rank, name, proc, log_path)
            self.roles.append(role)  # at once: a stop signal from here on stops it too (:meth:`run`)
            _first_for_oom(proc.pid)
            role.pump = threading.Thread(target=self._pump, args=(role,), daemon=True, name=f"log-{name}")
            role.pump.start()
            threading.Thread(target=self._wait, args=(role,), daemon=True, name=f"wait-{name}").start()
        if in_spares:
            self._say(f"[launcher] {in_spares} of {len(self.roles)} roles start in pre-started spare processes")
        (self.out / "roles.json").write_text(
            json_text(
                [{"rank": r.rank, "role": r.name, "pid": r.proc.pid, "log": str(r.log_path)} for r in self.roles],
                indent=2,
            )
        )

    def _pump(self, role: Role) -> None:
        with open(role.log_path, "a") as role_log:  # a restarted role appends to its log
            assert role.proc.stdout is not None  # started with stdout=PIPE
            for raw in role.proc.stdout:
                line = raw.decode(errors="replace").rstrip("\n")
                role_log.write(line + "\n")
                role_log.flush()
                if line.startswith(ERROR_PREFIX):
                    with self._echo_lock:
                        self._errors.append((role, line[len(ERROR_PREFIX) :]))
                self._say(f"[{role.name}, rank {role.rank}] {line}")

    def _wait(self, role: Role) -> None:
        code = role.proc.wait()
        self._events.put((time.time(), role, code))

    def run(self) -> None:
        """Start the job and wait for it; raises BagpipeError naming the first role that failed.
        Ctrl-C (or a stop signal :func:`launch` turned into KeyboardInterrupt) stops every
        role started so far, then goes on up."""
        try:
            self.start()
            done = 0
            while done < len(self.roles):
                died, role, code = self._events.get()
                done += 1
                if code != 0:
                    noticed = time.time()
                    early = self._exits_meanwhile(role, code)
                    self._say(
                        f"[launcher] {role.name} (rank {role.rank}, pid {role.proc.pid}) failed: {describe_exit(code)}; stopping the other roles"
                    )
                    stopped = self.stop()
                    times = {"died": died, "noticed": noticed, "stopped": time.time()}
                    self._join_pumps()
                    failure = self._failure(role, code, stopped, early)
                    failure.times = times
                    raise failure
        except KeyboardInterrupt as e:
            self._say(f"[launcher] {stopped_by(e)}: stopping every role")
            self.stop()
            raise
        finally:
            self._join_pumps()

    def _join_pumps(self) -> None:
        for r in self.roles:
            if r.pump is not None:
                r.pump.join(timeout=5)

    def _exits_meanwhile(self, first: Role, code: int) -> list[tuple[Role, int]]:
        """The roles that ended on their own while ``first``'s failure was noticed.

        A role that exits with an error may only be reacting to another's death (the
        oracle loses contact with a SIGKILLed trainer, and its exit can be reaped before
        the trainer's): when ``first`` exited with an error code and has not (yet) said a
        cause of its own, the exits that follow within :data:`LOST_CONTACT_WAIT_S` are
        collected, until one killed by a signal (the likely cause) arrives."""
        with self._echo_lock:
            mine = [line for r, line in self._errors if r is first]
        if code <= 0 or (mine and SECONDARY not in mine[0]):
            return []
        out: list[tuple[Role, int]] = []
        deadline = time.monotonic() + LOST_CONTACT_WAIT_S
        while (left := deadline - time.monotonic()) > 0:
            try:
                _, role, c = self._events.get(timeout=left)
            except queue.Empty:
                break
            out.append((role, c))
            if c < 0:
                break
        return out

    def _failure(self, first: Role, code: int, stopped: int, early: list[tuple[Role, int]] | None = None) -> RoleFailed:
        """The job's failure: the role that exited first, with the line it stopped with
        -- unless that line says it only lost contact with another role, or it said
        nothing (a trainer that refuses a resume closes its connections; a server notices
        and may exit before it): then the first role whose own error is another one, with
        that error, else a role that died by a signal meanwhile (``early``, from
        :meth:`_exits_meanwhile`). A role killed by a signal printed nothing and is
        blamed as it is."""
        with self._echo_lock:
            errors = list(self._errors)
        mine = [line for r, line in errors if r is first]
        if mine and SECONDARY not in mine[0]:
            return RoleFailed(first.name, first.rank, code, stopped, first.log_path, reason=mine[0])
        killed = next(((r, c) for r, c in early or [] if c < 0), None)
        if killed is not None and not any(SECONDARY not in line for _, line in errors):
            role, signalled = killed
            return RoleFailed(role.name, role.rank, signalled, stopped, role.log_path, self._oom_reason(signalled))
        if not mine:
            return RoleFailed(first.name, first.rank, code, stopped, first.log_path, self._oom_reason(code))
        cause = next(((r, line) for r, line in errors if SECONDARY not in line), (first, mine[0]))
        role, line = cause
        role_code = role.proc.returncode if role.proc.returncode is not None else code
        return RoleFailed(role.name, role.rank, role_code, stopped, role.log_path, reason=line)

    def _oom_reason(self, code: int) -> str | None:
        """Why a role killed by SIGKILL died, when the kernel's OOM killer killed a process of
        the roles' memory cgroup meanwhile (its counter moved): the one line the role could
        not print; None otherwise."""
        if code != -signal.SIGKILL or self._group is None or self._ooms is None:
            return None
        now = self._group.oom_kills()
        if now is None or now <= self._ooms:
            return None
        peak, limit = self._group.peak_bytes(), self._group.limit_bytes()
        at = f" at {peak / 2**20:,.0f} MiB" if peak else ""
        of = f" (limit {limit / 2**20:,.0f} MiB)" if limit else ""
        d = self.cfg.dist
        return (
            f"killed by the kernel's OOM killer{at}{of}: every role of this job shares the launcher's memory "
            f"cgroup ({self._group.path}); `bagpipe plan` with the same options and --trainers {d.trainers} "
            f"--servers {d.servers} prints each role's estimate and the smallest limit that works"
        )

    def stop(self) -> int:
        """SIGTERM every live role, SIGKILL what is left after the grace period; returns how many were live."""
        live = [r for r in self.roles if r.proc.poll() is None]
        for r in live:
            _signal(r.proc, signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        for r in live:
            try:
                r.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(r.proc, signal.SIGKILL)
                r.proc.wait()
        return len(live)


#: A role's ``oom_score_adj``: under its memory limit the kernel kills a role before the
#: launcher, which then says which role was killed and why (a process may raise its own
#: children's score; lowering the launcher's would take a privilege).
ROLE_OOM_SCORE_ADJ = 500


def _first_for_oom(pid: int) -> None:
    try:
        Path(f"/proc/{pid}/oom_score_adj").write_text(str(ROLE_OOM_SCORE_ADJ))
    except OSError:  # no procfs, or the role has ended already
        pass


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the role's whole session: it and anything it started
    except ProcessLookupError:
        pass


def launch(cfg: TrainConfig, placement: Placement | None = None) -> dict:
    """Run a distributed job on this machine (every role on loopback, or where
    ``placement`` puts it); returns trainer 0's summary (:func:`_launch`).

    A local job (no ``placement``: ``bagpipe train --trainers N --servers S``) stops as a
    one-process run does: SIGINT -- even inherited ignored, as a shell's background job
    (``cmd &``) gets it -- and SIGTERM or SIGHUP (``kill``, ``timeout``, a scheduler; one
    the parent chose to ignore, ``nohup``'s SIGHUP, stays ignored) unwind the launcher as
    Ctrl-C does (:func:`bagpipe.lifeline.stop_cleanly`): it stops every role itself, says in
    one line where the run can continue (:func:`where_to_continue`) and the process exits
    128 + the signal (130 for SIGINT) by SystemExit, the one line being its last word.
    With a ``placement`` (``bagpipe bench cluster``, in the benchmark's own process) the
    roles are stopped the same way on Ctrl-C and the KeyboardInterrupt goes on up."""
    if placement is not None:
        return _launch(cfg, placement)
    handlers = lifeline.stop_cleanly()
    try:
        return _launch(cfg, None)
    except KeyboardInterrupt as e:  # the roles are stopped (Launcher.run)
        sys.stdout.flush()  # the roles' last lines before this one
        print(f"bagpipe train: {stopped_by(e)}; {where_to_continue(cfg.run.out)}", file=sys.stderr, flush=True)
        signum = getattr(e, "signum", None)
        raise SystemExit(128 + signum if signum is not None else 130) from None
    finally:
        lifeline.restore(handlers)


def _launch(cfg: TrainConfig, placement: Placement | None) -> dict:
    """:func:`launch`'s job, its stop signals set up by the caller.

    The launcher checks what trainer 0 would check (:func:`bagpipe.train.preflight.preflight`:
    the data set, a resume, the checkpoints' disk space) and the job's memory
    (:func:`bagpipe.train.preflight.memory_checks`: each trainer's and each server's budget,
    and on one machine every role with the launcher against the memory cgroup they share),
    said once before any role starts, and holds the run folder's lock for the whole job (its roles know from
    ``BAGPIPE_RUN_LOCK_HELD`` not to take it again)."""
    if cfg.dist.secret_file:
        load_secret(
            cfg.dist.secret_file
        )  # a missing or readable-by-others secret file: one line, before any role starts
    if cfg.device.device == "cuda" and placement is None:  # the roles run here: what each trainer would refuse
        from bagpipe.device.cuda import cuda_unavailable_reason

        reason = cuda_unavailable_reason()
        if reason is not None:  # (every role started, a trainer refused it, the job restarted on it: round 23)
            raise ConfigError(f"--device cuda: {reason}; use --device cpu")
    if cfg.cache.store == "disk" and cfg.cache.store_dir and not cfg.cache.init_from_store and not cfg.run.resume:
        for k in range(cfg.dist.servers):  # what each server would refuse, said once and before any role starts
            shard = Path(cfg.cache.store_dir) / f"shard-{k}-of-{cfg.dist.servers}"
            if holds_store(shard):
                raise ConfigError(
                    f"--store-dir {shard} already holds a store: its rows would become this run's "
                    "starting tables; pass --init-from-store to start from them, or give an empty directory"
                )
    with RunDir(cfg.run.out).claim() as run:
        # what trainer 0 would refuse (a missing data set, a finished run, a changed setting,
        # another run's checkpoints, no room for the checkpoints), said here in one line
        # before anything in the folder changes (a folder claimed here is removed again)
        pre = preflight(cfg, run)
        # every memory refusal of the job, in the words `bagpipe plan` says (the trainers',
        # the servers', and every role's together against the cgroup a local job shares)
        memory_checks(cfg, pre.dataset, pre.stream, pre.shape, together=placement is None)
        return _run_job(cfg, run, placement)


def _run_job(cfg: TrainConfig, run: RunDir, placement: Placement | None) -> dict:
    """The attempts of the job in ``run`` (claimed and checked), restarted after a failure."""
    with Spares(cfg, run) as spares:
        summary = run.summary_file
        before = _stamp(summary)
        run.started()  # the roles' logs stay if the job fails
        attempt, restarts = cfg, 0
        while True:
            try:
                if restarts < cfg.dist.max_restarts and placement is None:  # a restart may still come
                    spares.fill_when_training(time.time())
                Launcher(attempt, restart=restarts, spares=spares if spares.count else None, placement=placement).run()
                break
            except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM: after the job's end there is nothing to continue
                if not (finished(run, cfg.run.steps) and _stamp(summary) != before):
                    raise
                log.info(  # it said "stopped ... run the same command with --resume", which was then refused
                    f"[launcher] {stopped_by(e)} after the run had ended; its summary and final checkpoint are written"
                )
                break
            except RoleFailed as failure:
                if finished(run, cfg.run.steps) and _stamp(summary) != before:  # a role died after the job's end
                    log.info(
                        f"[launcher] {failure.name} failed after the run had ended; its summary and final checkpoint are written"
                    )
                    break
                if failure.code == 2 and failure.reason and CheckpointFolder(run.path).latest_name() is None:
                    # a role refused a setting before the first checkpoint: restarts would meet the same
                    # refusal, and "run the command again" too (round 23: restarted twice, then said so)
                    failure.args = (f"{failure}; change that setting and run the command again",)
                    raise
                if restarts >= cfg.dist.max_restarts:  # the job ends: say where it can continue, as a signal does
                    again = "" if cfg.dist.max_restarts else " (--max-restarts N restarts a failed role by itself)"
                    failure.args = (f"{failure}; {where_to_continue(cfg.run.out)}{again}",)
                    raise
                restarts += 1
                attempt = _restart(cfg, run, failure, restarts)
        if _stamp(summary) == before:
            raise BagpipeError(f"every role exited cleanly but trainer 0 wrote no new {summary}")
    return json.loads(summary.read_text())


def _stamp(path: Path) -> tuple | None:
    """What tells one version of a file from the next (None: no file)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _restart(cfg: TrainConfig, run: RunDir, failure: RoleFailed, restarts: int) -> TrainConfig:
    """The configuration that restarts every role after ``failure``: from the latest
    complete checkpoint, or from the start when there is none yet. Says so, and adds the
    event to RUN/recovery.json."""
    ckpt = CheckpointFolder(run.path).latest_name()
    step = Manifest.load(run.path / "checkpoints" / ckpt).step if ckpt else None
    died = run.last_heartbeat()
    where = f"the checkpoint of step {step}" if step is not None else "the start (no checkpoint yet)"
    log.info(
        f"[launcher] {failure.name} died at step {died if died is not None else '?'}; restarting all roles "
        f"from {where} (restart {restarts} of {cfg.dist.max_restarts})"
    )
    if step is None and cfg.cache.store == "disk" and cfg.cache.store_dir:
        if cfg.cache.init_from_store:
            raise BagpipeError(
                f"cannot restart {failure.name}'s job: it started from the rows of --store-dir "
                f"{cfg.cache.store_dir}, which the failed attempt changed, and no checkpoint was written"
            )
        for k in range(cfg.dist.servers):  # rows of the failed attempt, in shards this job made
            shutil.rmtree(Path(cfg.cache.store_dir) / f"shard-{k}-of-{cfg.dist.servers}", ignore_errors=True)
    record = run.path / "recovery.json"
    events = json.loads(record.read_text()) if record.exists() else []
    events.append(
        {
            "restart": restarts,
            "role": failure.name,
            "exit": describe_exit(failure.code),
            "died_at_step": died,
            "from_checkpoint": step,
            "time": time.time(),
            **failure.times,
        }
    )
    atomic_write_text(record, json_text(events, indent=2))
    return cfg.replace(resume=step is not None)


class Spares:
    """Pre-started ``bagpipe worker --standby`` processes: each has imported everything a
    role needs and waits for its role on stdin, so a restart after a failure
    (``--max-restarts``) starts no interpreter and imports nothing -- on a busy machine
    that is most of a restart. One spare per role of the job, started once the job is
    training (their imports would otherwise compete with its start-up), and again after
    each restart has used them; the unused ones are stopped when the job ends.
    """

    def __init__(self, cfg: TrainConfig, run: RunDir):
        d = cfg.dist
        self.count = Layout(d.trainers, d.servers).world_size if d.max_restarts > 0 and d.spares else 0
        self.run = run
        self._procs: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def __enter__(self) -> Spares:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def fill_when_training(self, since: float) -> None:
        """Start the missing spares once the run trains a step after ``since`` (wall clock), in a thread."""
        if self.count:
            threading.Thread(target=self._fill, args=(since,), daemon=True, name="spares").start()

    def _beat(self) -> float:
        try:
            return self.run.heartbeat_file.stat().st_mtime
        except OSError:
            return 0.0

    def _fill(self, since: float) -> None:
        while not self._closed.is_set() and self._beat() <= since:
            time.sleep(0.2)
        env = lifeline.child_env(dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1"))
        with self._lock:
            self._procs = [p for p in self._procs if p.poll() is None]
            while not self._closed.is_set() and len(self._procs) < self.count:
                self._procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "bagpipe.cli", "worker", "--standby"],
                        env=env,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    def take(self) -> subprocess.Popen | None:
        """A live spare for a role (None: start an interpreter)."""
        with self._lock:
            while self._procs:
                p = self._procs.pop(0)
                if p.poll() is None:
                    return p
        return None

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            for p in self._procs:
                _signal(p, signal.SIGKILL)
                p.wait()
            self._procs.clear()
