"""Embedding servers: the store, partitioned over S processes, and its client.

Rows are partitioned by global row index: row g lives on server ``g % S`` at local row
``g // S`` (round-robin, so the hot low ids of every table spread over all servers).
Each server keeps its shard's weights *and* optimizer state in an ordinary
:class:`EmbeddingStore` (memory or disk) and serves batched requests.

Ordering, which exactness rests on:

* a server handles each client's requests in arrival order (one thread per client
  reading one ordered stream), so a client's write-back is never overtaken by its own
  later read;
* across clients, every write-back carries no order of its own; instead each client
  announces labels (``mark``: "all my write-backs of steps <= label are sent") and a
  read says which label it needs (``after``, the plan's ``fetch_after``). The server
  holds the read until *every* client has announced that label, so a row written back
  by trainer 1 is never read stale by trainer 0.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from bagpipe.budget.watch import RssSampler
from bagpipe.checkpoint import CheckpointReader, NoSpace, Part, restore_rows, take_snapshot, write_part
from bagpipe.checkpoint.writer import no_space
from bagpipe.distributed.transport import CONTROL, PART, REPLY, REQUEST, Transport
from bagpipe.errors import BagpipeError
from bagpipe.faults import pause_at
from bagpipe.store.base import EmbeddingStore
from bagpipe.store.init import RowInitializer

FINAL = 1 << 62  # the label a client announces when it will write nothing more


class ShardInit:
    """The initial values of one server's rows, in local row order.

    Local row l of shard k of S is global row l*S + k; values are those of the global
    :class:`RowInitializer`, so every layout of servers starts from the same bits.
    """

    def __init__(self, init: RowInitializer, shard: int, num_shards: int):
        self.base = init
        self.shard, self.num_shards = int(shard), int(num_shards)
        self.dim, self.seed, self.table_sizes = init.dim, init.seed, init.table_sizes
        self.shard_label = f"{shard}/{num_shards}"

    @property
    def num_rows(self) -> int:
        return shard_rows(self.base.num_rows, self.shard, self.num_shards)

    def rows(self, rows: np.ndarray) -> np.ndarray:
        return self.base.rows(np.asarray(rows, dtype=np.int64) * self.num_shards + self.shard)

    def range(self, start: int, stop: int) -> np.ndarray:
        return self.rows(np.arange(start, stop, dtype=np.int64))


def shard_rows(num_rows: int, shard: int, num_shards: int) -> int:
    """Rows of ``num_rows`` global rows that live on ``shard``."""
    return max(0, (num_rows - shard + num_shards - 1) // num_shards)


@dataclass
class ServerReport:
    """What a server did (its log line; trainer 0 asks for the same with a "stats" request)."""

    requests: dict = field(default_factory=dict)  # requests served, by kind
    waited_s: float = 0.0  # time reads were held for other clients' write-backs
    lock_s: float = 0.0  # time reads waited for the store's lock (other clients' reads and writes)
    read_s: float = 0.0  # time reads spent in the store, the lock held
    reply_s: float = 0.0  # time handing rows' replies (read, range) to the wire, until it took the last byte


class EmbeddingServer:
    """Serves one shard to the trainers ``clients`` until every one says goodbye.

    Args:
        store: the shard's store (local rows).
        transport: the job's transport.
        clients: ranks of the trainers.
    """

    def __init__(self, store: EmbeddingStore, transport: Transport, clients: list[int], memory: dict | None = None):
        self.store = store
        self.memory = dict(memory or {})  # its budget and estimate, reported with its measured peak
        self._rss: RssSampler | None = None
        assert isinstance(store.init, ShardInit), "a server's store holds one shard of the rows"
        self.init: ShardInit = store.init  # which shard of how many
        self.t = transport
        self.clients = list(clients)
        self._marks = {c: -1 << 62 for c in self.clients}
        self._cond = threading.Condition()
        self._store_lock = threading.Lock()  # the stores allow one reader + one writer; clients are many
        self._failure: tuple[int, BaseException] | None = None
        self._checkpoints: dict[int, dict] = {}  # step -> the clients arrived, rank 0's request, the result
        self._part_writer: threading.Thread | None = None  # writes the last cut's part in the background
        self.report = ServerReport()
        self._readers: list[threading.Thread] = []

    def serve(self) -> ServerReport:
        self._rss = RssSampler()
        threads = [
            threading.Thread(target=self._client_loop, args=(c,), name=f"serve-{c}", daemon=True) for c in self.clients
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if self._failure is None:  # every client said goodbye: its reader ended there
            for th in self._readers:
                th.join()
        if self._part_writer is not None:
            self._part_writer.join()
        self._rss.stop()
        if self._failure is not None:
            client, exc = self._failure
            if isinstance(exc, BagpipeError):  # PeerLost names the trainer already
                raise exc
            raise BagpipeError(f"serving trainer rank {client} failed: {str(exc).splitlines()[0]}") from exc
        return self.report

    def _client_loop(self, client: int) -> None:
        """Serve ``client``'s requests in arrival order. A reader thread takes them off the
        wire as they come, so a client that dies is noticed even while one of its requests
        is held (a read waiting for the other clients' marks): otherwise two trainers that
        died with reads held for each other's marks left the server waiting forever."""
        counts = self.report.requests
        inbox: queue.SimpleQueue = queue.SimpleQueue()
        reader = threading.Thread(target=self._read_loop, args=(client, inbox), name=f"recv-{client}", daemon=True)
        self._readers.append(reader)
        reader.start()
        try:
            while True:
                msg = inbox.get()
                if isinstance(msg, BaseException):
                    raise msg
                op = msg["op"]
                counts[op] = counts.get(op, 0) + 1
                if op == "bye":
                    return
                reply = self._handle(client, op, msg)
                if reply is not None:
                    t0 = time.perf_counter()
                    self.t.send(client, REPLY, reply)
                    if op in ("read", "range"):
                        with self._cond:  # one client thread each: the sums are shared
                            self.report.reply_s += time.perf_counter() - t0
        except BaseException as e:  # noqa: BLE001 - reported by serve()
            with self._cond:
                if self._failure is None:
                    self._failure = (client, e)
                self._cond.notify_all()

    def _read_loop(self, client: int, inbox: queue.SimpleQueue) -> None:
        """Take ``client``'s requests off the wire until its ``bye``; a failure (the client
        gone) is queued after what arrived and wakes every held request at once."""
        try:
            while True:
                msg = self.t.recv(client, REQUEST)
                inbox.put(msg)
                if msg["op"] == "bye":
                    return
        except BaseException as e:  # noqa: BLE001 - reported by serve()
            inbox.put(e)
            with self._cond:
                if self._failure is None:
                    self._failure = (client, e)
                self._cond.notify_all()

    def _checkpoint(self, client: int, msg: dict) -> dict:
        """One trainer's part of a checkpoint's cut: when every trainer has asked (so every
        write-back before the cut is applied: each client's requests are served in order),
        the last to arrive copies the rows this shard's part needs and starts writing the
        part in the background; each trainer gets the reply at once, and trainer 0 learns
        on the PART stream when the part is durable (see :meth:`_write_part`)."""
        step = int(msg["step"])
        with self._cond:
            c = self._checkpoints.setdefault(step, {"clients": set(), "params": None, "result": None})
            c["clients"].add(client)
            if "dir" in msg:  # trainer 0 names the folder and the kind
                c["params"] = msg
            writer = len(c["clients"]) == len(self.clients) and c["params"] is not None and c["result"] is None
            if writer:
                c["result"] = "cutting"
        if writer:
            try:
                p = c["params"]
                with self._store_lock:  # nothing else touches the shard during the cut
                    if self._part_writer is not None:  # trainer 0 waited for it before this cut: it is done
                        self._part_writer.join()
                    snap = take_snapshot(self.store, bool(p["everything"]))
                self._part_writer = threading.Thread(
                    target=self._write_part, args=(p, snap), name=f"checkpoint-{step}", daemon=True
                )
                self._part_writer.start()
                result: dict = {"cut": step}
            except BaseException as e:  # noqa: BLE001 - reported to every trainer
                result = {"error": f"server {self.init.shard} could not take its checkpoint cut: {e}"}
            with self._cond:
                c["result"] = result
                self._cond.notify_all()
        with self._cond:
            while not isinstance(c["result"], dict):
                if self._failure is not None:
                    raise BagpipeError("another client failed during a checkpoint")
                self._cond.wait(timeout=0.5)
            c["clients"].discard(client)
            if not c["clients"]:
                del self._checkpoints[step]
            return c["result"]

    def _write_part(self, params: dict, snap) -> None:
        """Write this shard's part of the checkpoint ``params`` names from the cut's copy
        ``snap``, then tell trainer 0 (the PART stream): the part, or why it failed."""
        step, shard, shards = int(params["step"]), self.init.shard, self.init.num_shards
        try:
            pause_at("checkpoint", step)  # a test kills us here: the part is being written, training goes on
            base = CheckpointReader(params["base"]) if params.get("base") else None
            part = write_part(Path(params["dir"]), snap, shard, shards, params["kind"], base)
            result: dict = {"step": step, "part": asdict(part)}
        except BaseException as e:  # noqa: BLE001 - reported to trainer 0, which discards the checkpoint
            result = {
                "step": step,
                "error": f"server {shard} could not write its checkpoint part: {e}",
                "no_space": no_space(e),
            }
        self.t.send(self.clients[0], PART, result)

    def _wait_for(self, label: int) -> None:
        """Block until every client announced ``label`` (all their write-backs <= label sent)."""
        if label < 0:
            return
        with self._cond:
            t0 = time.perf_counter()
            while min(self._marks.values()) < label:
                if self._failure is not None:
                    raise BagpipeError("another client failed")
                self._cond.wait(timeout=0.5)
            self.report.waited_s += time.perf_counter() - t0

    def _handle(self, client: int, op: str, msg: dict):
        if op == "read":
            self._wait_for(msg["after"])
            t0 = time.perf_counter()
            with self._store_lock:
                t1 = time.perf_counter()
                if msg.get("count", True):
                    w, s = self.store.read(msg["rows"])
                else:
                    w, s = self.store.peek(msg["rows"])
            t2 = time.perf_counter()
            with self._cond:
                self.report.lock_s += t1 - t0
                self.report.read_s += t2 - t1
            return {"w": w, "s": s}
        if op == "range":
            self._wait_for(msg["after"])
            with self._store_lock:
                w, s = self.store.read_range(msg["start"], msg["stop"])
            return {"w": w, "s": s}
        if op == "write":
            with self._store_lock:
                self.store.write(msg["rows"], msg["w"], msg["s"])
            return None
        if op == "mark":
            with self._cond:
                self._marks[client] = max(self._marks[client], int(msg["label"]))
                self._cond.notify_all()
            return None
        if op == "flush":
            with self._store_lock:
                self.store.flush()
            return {}
        if op == "written":  # the rows this shard wrote since initialisation (the digest)
            with self._store_lock:
                return {"rows": self.store.written_rows()}
        if op == "checkpoint":
            return self._checkpoint(client, msg)
        if op == "stats":
            return {
                "store": self.store.stats.as_dict(),
                "requests": dict(self.report.requests),
                "waited_s": self.report.waited_s,
                "lock_s": self.report.lock_s,
                "read_s": self.report.read_s,
                "reply_s": self.report.reply_s,
                "memory": self.memory | {"peak_anon_mb": self._rss.peak_anon_mb if self._rss else None},
            }
        raise BagpipeError(f"unknown request {op!r} from rank {client}")


class RemoteStore(EmbeddingStore):
    """An :class:`EmbeddingStore` whose rows live on embedding servers.

    Args:
        init: the global row initializer (sizes, D).
        state_dim: S.
        transport: the job's transport.
        servers: ranks of the S servers, in shard order.

    ``read`` may run in one thread while ``write``/``mark_written`` run in another (the
    prefetch pipeline's fetch and write-back threads); requests that expect a reply
    are serialised, so replies cannot be mixed up.
    """

    tracks_writes = False  # the servers keep track of their own rows

    def __init__(self, init: RowInitializer, state_dim: int, transport: Transport, servers: list[int]):
        super().__init__(init, state_dim)
        self.t = transport
        self.servers = list(servers)
        self.S = len(self.servers)
        self.read_floor = -1  # label every untracked read (peek, read_range) waits for
        self._reply_lock = threading.Lock()
        self._closed = False

    # routing -------------------------------------------------------------------------
    def _split(self, rows: np.ndarray):
        """(server index, positions in ``rows``, local rows) per server with rows."""
        if self.S == 1:
            return [(0, None, rows)] if len(rows) else []
        owner = rows % self.S
        out = []
        for k in range(self.S):
            pos = np.flatnonzero(owner == k)
            if len(pos):
                out.append((k, pos, rows[pos] // self.S))
        return out

    def _gather(self, rows: np.ndarray, after: int, count: bool) -> tuple[np.ndarray, np.ndarray]:
        n = len(rows)
        w = np.empty((n, self.dim), np.float32)
        s = np.empty((n, self.state_dim), np.float32)
        parts = self._split(rows)
        with self._reply_lock:
            for k, _, local in parts:  # every request first, so the servers work in parallel
                self.t.send(self.servers[k], REQUEST, {"op": "read", "rows": local, "after": after, "count": count})
            for k, pos, _ in parts:
                r = self.t.recv(self.servers[k], REPLY)
                if pos is None:
                    w, s = r["w"], r["s"]
                else:
                    w[pos], s[pos] = r["w"], r["s"]
        return w, s

    # EmbeddingStore -------------------------------------------------------------------
    def _read_after(self, rows: np.ndarray, after: int) -> tuple[np.ndarray, np.ndarray]:
        return self._gather(rows, after, count=True)

    def _read(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._gather(rows, self.read_floor, count=False)

    def _write(self, rows: np.ndarray, weights: np.ndarray, state: np.ndarray) -> None:
        for k, pos, local in self._split(rows):
            if pos is None:
                msg = {"op": "write", "rows": local, "w": weights, "s": state}
            else:
                msg = {"op": "write", "rows": local, "w": weights[pos], "s": state[pos]}
            self.t.send(self.servers[k], REQUEST, msg)

    def mark_written(self, label: int) -> None:
        for r in self.servers:
            self.t.send(r, REQUEST, {"op": "mark", "label": int(label)})

    def read_range(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        n = stop - start
        w = np.empty((n, self.dim), np.float32)
        s = np.empty((n, self.state_dim), np.float32)
        with self._reply_lock:
            spans = []
            for k, r in enumerate(self.servers):
                a = -(-(start - k) // self.S)  # first local row l with l*S + k >= start
                b = -(-(stop - k) // self.S)
                a, b = max(a, 0), max(b, 0)
                spans.append((k, a, b))
                if b > a:
                    self.t.send(r, REQUEST, {"op": "range", "start": a, "stop": b, "after": self.read_floor})
            for k, a, b in spans:
                if b > a:
                    rep = self.t.recv(self.servers[k], REPLY)
                    pos = np.arange(a, b, dtype=np.int64) * self.S + k - start
                    w[pos], s[pos] = rep["w"], rep["s"]
        return w, s

    def settle(self, label: int) -> None:
        self.mark_written(label)
        self.read_floor = max(self.read_floor, int(label))

    def finish_writes(self) -> None:
        """This client will write nothing more; later untracked reads wait for every client's end."""
        self.mark_written(FINAL)
        self.read_floor = FINAL

    def flush(self) -> None:
        with self._reply_lock:
            for r in self.servers:
                self.t.send(r, REQUEST, {"op": "flush"})
            for r in self.servers:
                self.t.recv(r, REPLY)

    def checkpoint(self, request: dict) -> None:
        """Ask every server for its cut of a checkpoint (see EmbeddingServer._checkpoint);
        returns once every server has taken it (their parts are written afterwards)."""
        with self._reply_lock:
            for r in self.servers:
                self.t.send(r, REQUEST, request)
            replies = [self.t.recv(r, REPLY) for r in self.servers]
        for rep in replies:
            if "error" in rep:
                raise BagpipeError(rep["error"])

    def parts(self, step: int) -> list[Part]:
        """Wait until every server has written its part of the checkpoint of ``step`` (the
        PART stream; trainer 0's checkpoint writer calls it); the parts in shard order.
        A server that failed for lack of space raises :class:`NoSpace`."""
        replies = [self.t.recv(r, PART) for r in self.servers]
        for rep in replies:
            if rep.get("step") != step:  # pragma: no cover - a protocol bug
                raise BagpipeError(f"a checkpoint part of step {rep.get('step')} came while waiting for step {step}")
        failed = [rep for rep in replies if "error" in rep]
        if failed:
            raise (NoSpace if all(r["no_space"] for r in failed) else BagpipeError)(failed[0]["error"])
        return [Part(**rep["part"]) for rep in replies]

    def written_rows(self) -> np.ndarray:
        """Every global row a server wrote since initialisation, ascending (asks each server)."""
        with self._reply_lock:
            for r in self.servers:
                self.t.send(r, REQUEST, {"op": "written"})
            local = [self.t.recv(r, REPLY)["rows"] for r in self.servers]
        return np.sort(np.concatenate([rows * self.S + k for k, rows in enumerate(local)]))

    def server_stats(self) -> list[dict]:
        with self._reply_lock:
            for r in self.servers:
                self.t.send(r, REQUEST, {"op": "stats"})
            return [self.t.recv(r, REPLY) for r in self.servers]

    def abandon(self) -> None:
        self._closed = True  # no goodbye: after a failure the servers fail too (they lose this client)

    def close(self) -> None:
        """Say goodbye to every server (idempotent); a server stops when all its clients have."""
        if self._closed:
            return
        self._closed = True
        for r in self.servers:
            self.t.send(r, REQUEST, {"op": "bye"})


def setup_message(init: RowInitializer, state_dim: int, restore: str | None = None) -> dict:
    """What trainer 0 tells every server at start-up: the row space, its optimizer state,
    and the checkpoint folder whose rows to start from (None: the initial tables)."""
    return {
        "table_sizes": init.table_sizes,
        "dim": init.dim,
        "seed": init.seed,
        "state_dim": state_dim,
        "restore": restore,
    }


def receive_setup(transport: Transport, trainer0: int) -> tuple[RowInitializer, int, str | None]:
    msg = transport.recv(trainer0, CONTROL)
    return RowInitializer(msg["table_sizes"], msg["dim"], msg["seed"]), int(msg["state_dim"]), msg.get("restore")


def restore_shard(store: EmbeddingStore, folder: str, shard: int, shards: int) -> tuple[int, int]:
    """Make this shard's rows (g % shards == shard) those of the checkpoint in ``folder``,
    whatever layout wrote it: the rows it holds are loaded, the shard's other written rows
    go back to their initial value. Returns (the checkpoint's step, rows loaded)."""
    reader = CheckpointReader(folder)
    loaded = restore_rows(store, reader, shard, shards)
    store.flush()
    return reader.manifest.step, loaded
