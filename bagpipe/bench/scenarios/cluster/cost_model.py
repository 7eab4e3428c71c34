"""The cost model of ``bagpipe bench cluster``: bytes per step on every link, from the
plans alone, and the step time they predict.

**Bytes.** The oracle's planner is replayed here on the run's own batches (same data,
stream, cache size, L, number of trainers) and every plan split as the oracle role
splits it (:func:`bagpipe.distributed.partition.partition`). For each step the model
lists every message a trainer exchanges, with its size on the wire as the transport
frames it (a :data:`~bagpipe.distributed.transport.HEADER_BYTES` header, the body of
:mod:`bagpipe.distributed.wire` when it does not fit inside it):

* oracle -> trainer: its plan; trainer -> oracle: one credit;
* trainer -> server k: the read request (row ids), write-backs (ids, weights, optimizer
  state), one ``mark`` a step; server k -> trainer: the rows read (D + S floats a row);
* between trainers (N > 1): the synchronised rows' gradients (K x D floats) and DDP's
  dense gradients, each all-reduced in a ring: 2 (N - 1) / N of the buffer each way;
  with ``--cache-sync owner`` instead of the row all-reduce, each trainer's part of the
  plan's all-to-alls: gradients (D floats a row) to the rows' owners and rows (D + S
  floats) to their next users, one message per peer with rows to move.

Each gloo message carries a 48-byte preamble; TCP cuts it into segments of at most
:data:`MSS` bytes of payload, each a frame with :data:`FRAME_HEADERS` bytes of
Ethernet/IP/TCP headers (what an interface counter counts), and the receiver returns
one :data:`FRAME_HEADERS`-byte ACK per two segments. The model therefore predicts the
interface counters of every host, both directions.

**Time.** A link direction needs bytes / rate (the rate a TCP probe achieves under the
same shaping). Lookahead plans are prefetched by background threads, so a step takes
``max(compute, slowest link)``. The baselines (``nocache``, ``lru``) run synchronously
in the trainer's thread: it takes the plan, sends the write-backs, asks for the rows
and waits for them, one after the other, so their step is ``compute + trainer 0's bytes
sent / its up rate + bytes received / its down rate`` (at least the slowest link).
``compute`` is the measured forward + backward + optimizer time of the run's trainer 0.

With emulated compute (``bench cluster --dilation k``) the compute is a known delay and
nothing is measured but the links' rates: :func:`predict_emulated_ms` adds trainer 0's
dense all-reduce and urgent row sync after the compute (and, for the baselines, the
rows fetched in turn before it), overlaps the deferred row sync with the next step, and
bounds the step below by every host's bytes over its link (trainer 0's bytes are split
by what they are: :data:`PARTS`). ``bench cluster --project`` runs the same prediction
at the undilated paper's cluster for more trainers and servers
(:mod:`bagpipe.bench.scenarios.cluster.projection`).

A pipelined trainer's write-backs of its last step (every row still cached) leave on
its write-back thread just as the interface counters are read; the model counts them
and says how many bytes race the reading, and a measurement between the two counts
as agreeing (:meth:`PlanTraffic.within`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from bagpipe.cache.setup import LocalPlans
from bagpipe.config.train import TrainConfig
from bagpipe.data.schema import DatasetMeta
from bagpipe.distributed.layout import Layout
from bagpipe.distributed.oracle_report import OracleReport
from bagpipe.distributed.oracle_role import oracle_cache, trainer_plans
from bagpipe.distributed.transport import HEADER_BYTES, INLINE_BYTES
from bagpipe.distributed.wire import PLAN, REPLY, REQUEST, encode
from bagpipe.optim.names import row_state_dim
from bagpipe.train.step.emulated import FORWARD_SHARE

MSS = 1448  # TCP payload of a full segment: MTU 1500 - IP 20 - TCP 20 - timestamps 12
FRAME_HEADERS = 66  # Ethernet 14 + IP 20 + TCP 32 bytes per frame
GLOO_PREAMBLE = 48  # gloo's header of every message (six 64-bit words)
SEGMENTS_PER_ACK = 2  # delayed ACKs
MIB = 1 << 20


@dataclass
class Direction:
    """One direction of one host's link, per step: the transport's messages and what they become on the wire."""

    payload: float = 0.0  # bytes handed to gloo
    segments: float = 0.0

    def add(self, nbytes: float, count: float = 1.0) -> None:
        """``count`` gloo messages of ``nbytes`` each."""
        per = math.ceil((nbytes + GLOO_PREAMBLE) / MSS) if nbytes else 1
        self.payload += count * (nbytes + GLOO_PREAMBLE)
        self.segments += count * per

    @property
    def data_frames_bytes(self) -> float:
        return self.payload + self.segments * FRAME_HEADERS


@dataclass
class Link:
    up: Direction = field(default_factory=Direction)  # what the host sends
    down: Direction = field(default_factory=Direction)  # what it receives

    def wire(self) -> tuple[float, float]:
        """(bytes sent, bytes received) per step on the host's interface, ACKs included."""
        acks_up = self.down.segments / SEGMENTS_PER_ACK * FRAME_HEADERS
        acks_down = self.up.segments / SEGMENTS_PER_ACK * FRAME_HEADERS
        return self.up.data_frames_bytes + acks_up, self.down.data_frames_bytes + acks_down


def message(d: Direction, body_bytes: int) -> None:
    """One transport message with a body of ``body_bytes`` into ``d``."""
    d.add(HEADER_BYTES)
    if body_bytes > INLINE_BYTES:
        d.add(body_bytes)


def _pad8(n: int) -> int:
    return -(-n // 8) * 8


@dataclass
class PlanTraffic:
    """Bytes per step (averaged over the measured steps) on every host's link, and what the
    synchronous baselines wait for."""

    links: dict[str, Link]
    racing: dict[str, Link]  # part of ``links``: what may leave just before or just after the counters are read
    rows_fetched: float  # per trainer per step
    rows_written: float
    plan_bytes: float  # one trainer's plan, encoded
    parts: dict[str, Link] = field(default_factory=dict)
    """Trainer 0's link split by what the bytes are (:data:`PARTS`); they sum to ``links["trainer 0"]``."""
    dense_buckets: list[tuple[float, float]] = field(default_factory=lambda: [(1.0, 1.0)])
    """DDP's buckets in the order it all-reduces them: (share of the backward done when the
    bucket is ready, share of the dense bytes it holds) (:func:`ddp_buckets`)."""

    def per_link(self, links: dict[str, Link] | None = None) -> dict[str, dict[str, float]]:
        return {name: dict(zip(("sent", "received"), link.wire())) for name, link in (links or self.links).items()}

    def within(self, measured: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        """Measured bytes over the model's for every link and direction: 1 when inside the
        model's range (its bytes, less those racing the counters' reading, up to all of them),
        else the ratio to the nearer end."""
        full, racing = self.per_link(), self.per_link(self.racing)
        out: dict[str, dict[str, float]] = {}
        for role, dirs in measured.items():
            if role in full:
                out[role] = {}
                for d, got in dirs.items():
                    hi = full[role][d]
                    lo = hi - racing[role][d]
                    out[role][d] = 1.0 if lo <= got <= hi else got / (lo if got < lo else hi)
        return out


PARTS = ("embedding", "dense", "sync_urgent", "sync_deferred")
"""What trainer 0's bytes are: plans, credits, fetches and write-backs (``embedding``); the
dense all-reduce; the row sync of the rows the next step needs or that leave
(``sync_urgent``, waited for) and of the rest (``sync_deferred``, overlapped with the next step)."""


def ddp_buckets(model, bucket_mb: float) -> list[tuple[float, int]]:
    """DDP's buckets of ``model``'s dense gradients (float32), in the order it all-reduces
    them: (share of the backward done when the bucket's last gradient is ready, its
    elements). DDP fills buckets in the reverse order of ``model.parameters()`` (its guess
    of the backward's order) up to ``bucket_mb`` MiB each (0: torch's default, a first
    bucket of 1 MiB and then 25 MiB; a bucket closes once it reaches its limit); the emulated
    backward (:class:`~bagpipe.train.step.emulated.EmulatedStep`) has a gradient ready once
    the elements before it and its own are done, its time proportional to elements."""
    params = [p.numel() for p in reversed(list(model.parameters())) if p.requires_grad]
    total = sum(params) or 1
    limits = [bucket_mb * MIB] if bucket_mb > 0 else [MIB, 25 * MIB]
    buckets: list[tuple[float, int]] = []
    done = size = 0
    for n in params:
        done += n
        size += n
        if size * 4 >= limits[min(len(buckets), len(limits) - 1)]:
            buckets.append((done / total, size))
            size = 0
    if size:
        buckets.append((done / total, size))
    return buckets


def plan_traffic(cfg: TrainConfig, dense: list[tuple[float, int]], warmup: int) -> PlanTraffic:
    """Replay the oracle of run ``cfg`` and count its messages (see the module docstring);
    ``dense``: the dense model's buckets (:func:`ddp_buckets`)."""
    D = cfg.arch.model_config().embedding_dim
    state = row_state_dim(cfg.optim.optimizer, D)
    stream, setup = oracle_cache(cfg)  # the cache and planner the oracle role sets up for this run
    planner = LocalPlans(setup)
    layout = Layout(cfg.dist.trainers, cfg.dist.servers)
    N, S = layout.trainers, layout.servers
    reply_overhead = len(encode(REPLY, {"w": np.zeros((0, D), np.float32), "s": np.zeros((0, state), np.float32)}))
    names = [layout.name(r) for r in range(layout.world_size)]
    links: dict[str, Link] = {n: Link() for n in names}
    end: dict[str, Link] = {n: Link() for n in names}
    parts: dict[str, Link] = {n: Link() for n in PARTS}
    fetched = written = plan_bytes = 0.0
    measured = max(cfg.run.steps - warmup, 1)

    def both(link: Link, part: Link | None, up: bool, body: int) -> None:
        message(link.up if up else link.down, body)
        if part is not None:
            message(part.up if up else part.down, body)

    def rows_msg(rows: np.ndarray, values: bool) -> int:
        body = (
            {"op": "write", "rows": rows, "w": np.zeros((0, D), np.float32), "s": np.zeros((0, state), np.float32)}
            if values
            else {"op": "read", "rows": rows, "after": 1, "count": True}
        )
        extra = _pad8(len(rows) * D * 4) + _pad8(len(rows) * state * 4) if values else 0
        return len(encode(REQUEST, body)) + extra

    pipelined = cfg.cache.spec.pipelined
    for split in trainer_plans(planner.plans(stream, 0, cfg.run.steps), N, cfg.dist.cache_sync, OracleReport()):
        step = split[0].step
        if step < warmup:
            continue
        last = step == cfg.run.steps - 1
        for t, p in enumerate(split):
            tl, ol = links[names[t]], links["oracle"]
            emb = parts["embedding"] if t == 0 else None
            body = len(encode(PLAN, p))
            both(tl, emb, False, body)
            message(ol.up, body)
            both(tl, emb, True, 0)  # the credit
            message(ol.down, 0)
            plan_bytes += body / N / measured
            fetched += len(p.fetch_rows) / N / measured
            for k in range(S):
                sl = links[names[N + k]]
                for rows, values in ((p.fetch_rows, False), (p.evict_before_rows, True), (p.evict_after_rows, True)):
                    mine = rows[rows % S == k] // S
                    if not len(mine):
                        continue
                    size = rows_msg(mine, values)
                    both(tl, emb, True, size)
                    message(sl.down, size)
                    if pipelined and last and values:  # the write-back of the last step races the counters' reading
                        message(end[names[t]].up, size)
                        message(end[names[N + k]].down, size)
                    if not values:  # the reply
                        reply = reply_overhead + _pad8(len(mine) * D * 4) + _pad8(len(mine) * state * 4)
                        both(tl, emb, False, reply)
                        message(sl.up, reply)
                    else:
                        written += len(mine) / N / measured
                both(tl, emb, True, 0)  # the step's mark
                message(sl.down, 0)
            if N > 1 and cfg.dist.cache_sync == "owner":
                for part, counts in exchange_messages(p, D, state):
                    for d, sizes in ((tl.up, counts[0]), (tl.down, counts[1])):
                        for nbytes in sizes:
                            d.add(nbytes)
                            if t == 0:
                                (parts[part].up if d is tl.up else parts[part].down).add(nbytes)
            if N > 1:  # ring all-reduces: 2 (N - 1) messages of 1/N of each buffer each way
                owner = cfg.dist.cache_sync == "owner"
                K, K1 = (0, 0) if owner else (len(p.sync_slots), min(p.sync_urgent, len(p.sync_slots)))
                for part, buffer in (
                    ("sync_urgent", K1 * D * 4),
                    ("sync_deferred", (K - K1) * D * 4),
                    *(("dense", n * 4) for _, n in dense),
                ):
                    if not buffer:
                        continue
                    for d in (tl.up, tl.down, *((parts[part].up, parts[part].down) if t == 0 else ())):
                        d.add(buffer / N, 2 * (N - 1))
    for link in [*links.values(), *end.values(), *parts.values()]:  # per step
        for d in (link.up, link.down):
            d.payload /= measured
            d.segments /= measured
    elements = sum(n for _, n in dense) or 1
    buckets = [(ready, n / elements) for ready, n in dense]
    return PlanTraffic(links, end, fetched, written, plan_bytes, parts, buckets)


def exchange_messages(p, D: int, state: int) -> list[tuple[str, tuple[list[int], list[int]]]]:
    """A trainer's messages of ``--cache-sync owner``'s all-to-alls in plan ``p``: per part,
    the sizes of what it sends and receives, one message per peer with rows to move
    (gradients: D floats a row; rows: D + S). What the trainer waits for is
    ``sync_urgent``: the urgent half, and the deferred half's rows (delivered after the
    next step's backward, before the step after it); only the deferred half's gradients
    travel while the next step computes (``sync_deferred``)."""
    N = p.num_trainers
    out = []
    for half, grads, rows in ((0, "sync_urgent", "sync_urgent"), (1, "sync_deferred", "sync_urgent")):
        for part, width, send, recv in (
            (grads, D, p.red_send_counts, p.red_recv_counts),
            (rows, D + state, p.dlv_send_counts, p.dlv_recv_counts),
        ):
            sent, got = (
                [int(n) * width * 4 for n in counts[half * N : (half + 1) * N] if n] if len(counts) else []
                for counts in (send, recv)
            )
            out.append((part, (sent, got)))
    return out


def predict_step_ms(
    traffic: PlanTraffic, rates_bytes_s: dict[str, tuple[float, float]], compute_ms: float, pipelined: bool
) -> dict[str, float | str]:
    """The model's step time (ms) from the bytes of every link and the rate each achieves
    (host -> (up, down) bytes/s): ``max(compute, slowest link)`` for pipelined plans,
    ``compute + trainer 0's serial transfers`` for synchronous ones, or ``compute + the
    busiest server's link`` where that takes longer (its write-backs, then its replies:
    :func:`_in_turn`), and at least the slowest link."""
    link_ms = {
        name: _ms(link, rates_bytes_s[name], _in_turn(name, pipelined))
        for name, link in traffic.links.items()
        if name in rates_bytes_s
    }
    slowest = max(link_ms.values()) if link_ms else 0.0
    if pipelined:
        step = max(compute_ms, slowest)
    else:  # every byte trainer 0 sends or receives is waited for in turn (measured so: see docs/distributed.md)
        serial = _ms(traffic.links["trainer 0"], rates_bytes_s["trainer 0"], in_turn=True)
        step = max(compute_ms + max(serial, _busiest(link_ms, "server")), slowest)
    link = max(link_ms, key=lambda name: link_ms[name]) if link_ms else ""
    return {"step_ms": step, "slowest_link_ms": slowest, "bottleneck": link if slowest > compute_ms else "compute"}


def _ms(link: Link, rate: tuple[float, float], in_turn: bool = False) -> float:
    """Time (ms) ``link``'s bytes of a step need at ``rate`` (up, down) bytes/s: both
    directions at once, or one after the other (``in_turn``: an embedding server of a
    synchronous mode, below)."""
    sent, received = link.wire()
    up, down = sent / rate[0], received / rate[1]
    return (up + down if in_turn else max(up, down)) * 1000


def _busiest(ms: dict[str, float], kind: str) -> float:
    """The longest time among the hosts whose name starts with ``kind`` ("server", "trainer"); 0 if none."""
    return max((v for k, v in ms.items() if k.startswith(kind)), default=0.0)


def _in_turn(name: str, pipelined: bool) -> bool:
    """Whether host ``name``'s two directions are used one after the other in a step.

    An embedding server's, in a synchronous mode (``nocache``, ``lru``): it holds every
    read of step t until every trainer has written back what step t - 1 evicted (the
    read's label; exactness), and the trainers ask for step t's rows only then, so the
    server's link receives the write-backs and requests and then sends the replies -- never
    both at once. Measured: the servers' ``waited_s`` (the reads held) is 0.1-0.6 s a read
    for ``nocache`` at 8 trainers (docs/distributed.md). With lookahead the write-backs and
    prefetches of different steps overlap, and trainers' links carry both directions
    at once (a collective's send and receive)."""
    return not pipelined and name.startswith("server")


def predict_emulated_ms(
    traffic: PlanTraffic, rates_bytes_s: dict[str, tuple[float, float]], compute_ms: float, pipelined: bool
) -> dict[str, float | str]:
    """The step time (ms) of a run whose compute is a known delay (``--emulate-compute``):
    every term from the plans' bytes and the links' rates, nothing measured but the rates.

    Trainer 0's step, in the order the trainer waits for each (``t_X``: trainer 0's bytes of
    part X over its link, :data:`PARTS`): the deferred row sync of the previous step
    overlaps what comes before the next step's dense all-reduce (gloo runs collectives in
    order); the dense all-reduce runs bucket by bucket as the backward makes each ready
    (``traffic.dense_buckets``; a bucket's share of ``t_dense`` by its bytes, each after the
    one before it), so only what is left of it when the backward ends is waited for
    (``dense_exposed_ms``); then the urgent row sync:

    * pipelined (lookahead): the compute starts at once, the fetches and write-backs run
      on background threads;
    * synchronous (nocache, lru): the rows are fetched first, in turn (``t_embedding`` =
      trainer 0's embedding bytes sent / up + received / down, at least the busiest
      server's link, its received bytes and then its sent ones: every trainer asks at once,
      after every trainer's write-back, :func:`_in_turn`), then the compute;

    so a step is ``max(dense done, t_embedding + compute) + t_sync_urgent`` (with every
    bucket ready at the backward's end: ``max(t_embedding + compute, t_sync_deferred) +
    t_dense + t_sync_urgent``),
    and at least every host's whole step of bytes over its link (``trainer_link``,
    ``server``, ``oracle``): a link cannot carry more. ``bound`` names the largest term.
    """
    up, down = rates_bytes_s["trainer 0"]
    p = traffic.parts
    t = {name: _ms(p[name], (up, down)) if name in p else 0.0 for name in PARTS}
    serial = _ms(p["embedding"], (up, down), in_turn=True) if "embedding" in p else 0.0
    hosts = {
        name: _ms(link, rates_bytes_s[name], _in_turn(name, pipelined))
        for name, link in traffic.links.items()
        if name in rates_bytes_s
    }
    server = _busiest(hosts, "server")
    oracle = hosts.get("oracle", 0.0)
    trainer_link = _busiest(hosts, "trainer")
    embedding = 0.0 if pipelined else max(serial, server)
    backward_start = embedding + compute_ms * FORWARD_SHARE
    backward_end = embedding + compute_ms
    done = t["sync_deferred"]  # the collectives before the first bucket's
    ready = 0.0
    for share_done, share_bytes in traffic.dense_buckets:  # DDP launches its buckets in order
        ready = max(ready, backward_start + share_done * (backward_end - backward_start))
        done = max(done, ready) + t["dense"] * share_bytes
    dense_exposed = max(done - max(backward_end, t["sync_deferred"]), 0.0)  # the deferred sync's wait is the row sync's
    chain = max(done, backward_end) + t["sync_urgent"]
    floors = {"trainer link": trainer_link, "server link": server, "oracle link": oracle}
    step = max(chain, *floors.values())
    if step > chain:
        bound = max(floors, key=lambda k: floors[k])
    else:
        terms = {
            "compute": compute_ms,
            "embedding access": embedding,
            "dense all-reduce": dense_exposed,
            "row sync": t["sync_urgent"] + max(t["sync_deferred"] - compute_ms - embedding, 0.0),
        }
        bound = max(terms, key=lambda k: terms[k])
    return {
        "step_ms": step,
        "compute_ms": compute_ms,
        "embedding_ms": embedding,
        "dense_ms": t["dense"],
        "dense_exposed_ms": dense_exposed,
        "sync_urgent_ms": t["sync_urgent"],
        "sync_deferred_ms": t["sync_deferred"],
        "trainer_link_ms": trainer_link,
        "server_link_ms": server,
        "oracle_link_ms": oracle,
        "embedding_share": embedding / step if step else 0.0,
        "bottleneck": bound,
    }


def model_for(cfg: TrainConfig, traffic, time_per_step_ms: dict, rates: dict[str, dict[str, float]]) -> dict:
    """The cost model's prediction for a run of ``cfg`` (its ``traffic``, :func:`plan_traffic`)
    at the probed ``rates`` (role -> Mbit/s sent and received): with emulated compute from
    the delay alone (:func:`predict_emulated_ms`), else with the run's measured compute time."""
    mbit = {role: (v["sent"] * 1e6 / 8, v["received"] * 1e6 / 8) for role, v in rates.items()}
    for role in traffic.links:  # links not probed: shaped as the probed one of their kind
        if role not in mbit:
            mbit[role] = mbit["trainer 0" if role.startswith("trainer") else "server 0"]
    t = time_per_step_ms
    if cfg.approx.emulate_compute is not None:  # the compute is known: nothing measured but the rates
        from bagpipe.config.compute import parse_compute

        per_trainer = cfg.data.batch_size // cfg.dist.trainers
        delay = parse_compute(cfg.approx.emulate_compute).seconds(per_trainer) * 1000
        pred = predict_emulated_ms(traffic, mbit, delay, pipelined=cfg.cache.spec.pipelined)
    else:
        pred = predict_step_ms(
            traffic, mbit, t["forward"] + t["backward"] + t["optimizer"], pipelined=cfg.cache.spec.pipelined
        )
    step_ms = float(pred["step_ms"])
    return {**pred, "samples_per_s": cfg.data.batch_size / step_ms * 1000 if step_ms else float("nan")}


def traffic_for(cfg: TrainConfig, meta: DatasetMeta, warmup: int) -> PlanTraffic:
    """:func:`plan_traffic` of a run (the dense parameters counted from its model)."""
    import torch

    from bagpipe.models.registry import build_model

    torch.manual_seed(0)
    model = build_model(cfg.arch.model_config(), meta.num_dense, meta.num_features)
    return plan_traffic(cfg, ddp_buckets(model, cfg.dist.ddp_bucket_mb), warmup)
