"""The embedding servers (``bagpipe/distributed/server.py``) over the transport, tested
directly: threads and an in-memory network, no processes.

:class:`EmbeddingServer` and :class:`RemoteStore` over :class:`Transport` on a fake wire
(``tests/concurrency.py``'s :class:`Cluster`): a read with ``after=k`` is held until
*every* client has marked k, then sees the newest values (client 1's write-back is
visible to client 0's read); a client's requests are served in order; ``bye`` from
every client ends ``serve()``; a client that disappears or sends a bad request makes
``serve()`` raise a :class:`BagpipeError` naming it, and a read waiting on its marks
fails instead of hanging, also when every client dies with reads held for each
other's marks; rows route to server g % S at local row g // S (S = 1, 2,
3), reads and ``read_range`` reassemble in the caller's order, and after
``finish_writes`` untracked reads wait for every client's last write-back.

The transport's own framing, encoding and authentication are tested in
``tests/unit/distributed/test_wire.py``; here every server and client joins with the job's
secret first. Every thread a test starts must have ended when it finishes
(``every_thread_ends``).
"""

from __future__ import annotations

import numpy as np
import pytest
from concurrency import (
    HELD,
    S_DIM,
    Background,
    D,
    row_values,
    small_table,
    wait_until,
)

from bagpipe.distributed.server import FINAL
from bagpipe.distributed.transport import REQUEST, PeerLost
from bagpipe.errors import BagpipeError
from bagpipe.store.init import RowInitializer
from bagpipe.store.memory import MemoryStore

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60), pytest.mark.usefixtures("every_thread_ends")]


@pytest.fixture
def init() -> RowInitializer:
    return small_table()


def test_a_read_waits_until_every_client_marked_its_label(clusters, init):
    cl = clusters(init)
    c0, c1 = cl.clients
    rows = np.array([3, 0, 2, 1], np.int64)  # both servers
    c0.mark_written(3)
    reading = Background(lambda: c0.read(rows, after=3), "trainer 0 read")
    assert wait_until(lambda: cl.requests("read") == [1, 1])
    assert not reading.finished(HELD), "served before trainer 1 marked anything"
    c1.mark_written(2)
    c1.flush()  # a round trip behind the mark: both servers have taken it
    assert not reading.finished(HELD), "served after trainer 1 marked 2 < 3"
    new_w, new_s = row_values(2, 5.0)
    c1.write(rows[:2], new_w, new_s)  # rows 3 and 0: one on each server
    c1.mark_written(3)
    w, s = reading.result()
    np.testing.assert_array_equal(w[:2], new_w)
    np.testing.assert_array_equal(s[:2], new_s)
    np.testing.assert_array_equal(w[2:], init.rows(rows[2:]))
    np.testing.assert_array_equal(s[2:], 0)
    assert all(srv.report.waited_s > 0 for srv in cl.servers)
    # the hold is counted apart from the store's read and the reply's send, which follow it
    assert all(0 < srv.report.read_s < srv.report.waited_s for srv in cl.servers)
    assert all(0 <= srv.report.lock_s < srv.report.waited_s for srv in cl.servers)
    # only the rows' replies are timed (flush's is not): the read's, once its send returned
    assert wait_until(lambda: all(srv.report.reply_s > 0 for srv in cl.servers))


def test_a_clients_requests_are_served_in_order(clusters, init):
    cl = clusters(init, trainers=1)
    c = cl.clients[0]
    rows = np.array([4, 1, 6, 3], np.int64)
    for k in range(10):
        w, s = row_values(len(rows), float(k))
        c.write(rows, w, s)
        got_w, got_s = c.read(rows)  # no mark needed: the same client's write comes first
        np.testing.assert_array_equal(got_w, w)
        np.testing.assert_array_equal(got_s, s)
    assert cl.requests("write") == [10, 10] and cl.requests("read") == [10, 10]


def test_bye_from_every_client_ends_serve(clusters, init):
    cl = clusters(init)
    c0, c1 = cl.clients
    c0.read(np.arange(init.num_rows))
    c0.close()
    c0.close()  # idempotent: says goodbye once
    assert not any(b.finished(HELD) for b in cl.serving), "a server stopped while trainer 1 still talks to it"
    c1.close()
    reports = [b.result() for b in cl.serving]
    assert [r.requests["bye"] for r in reports] == [2, 2]
    assert [r.requests["read"] for r in reports] == [1, 1]


def test_a_client_that_disappears_stops_serve_and_the_reads_waiting_for_it(clusters, init):
    cl = clusters(init)
    c0, _ = cl.clients
    c0.mark_written(0)
    reading = Background(lambda: c0.read(np.array([0, 1]), after=0), "trainer 0 read")
    assert wait_until(lambda: cl.requests("read") == [1, 1])
    cl.net.kill(1)  # trainer 1's process dies before marking 0
    for b in cl.serving:
        with pytest.raises(
            PeerLost,
            match=r"^server [01] lost contact with trainer 1 while receiving from it \(Connection closed by peer \[127\.0\.0\.1\]:29501\)$",
        ):
            b.result()
    # the held read was refused and its server exited: trainer 0 learns it instead of waiting forever
    with pytest.raises(PeerLost, match=r"^trainer 0 lost contact with server 0 while receiving from it"):
        reading.result()


def test_clients_that_die_with_reads_held_for_each_other_stop_serve(clusters, init):
    """Both trainers die while each has a read held for the other's mark: every server
    notices (a reader keeps taking requests off the wire while one is held) and stops,
    instead of waiting for marks that never come."""
    cl = clusters(init)
    c0, c1 = cl.clients
    Background(lambda: c0.read(np.array([0, 1]), after=0), "trainer 0 read")  # held: nobody marked 0
    Background(lambda: c1.read(np.array([2, 3]), after=1), "trainer 1 read")  # held: nobody marked 1
    assert wait_until(lambda: cl.requests("read") == [2, 2])
    cl.net.kill(0)
    cl.net.kill(1)
    for b in cl.serving:
        with pytest.raises(PeerLost, match=r"^server [01] lost contact with trainer [01] while receiving from it"):
            b.result()


def test_a_bad_request_fails_serve_naming_the_client(clusters, init):
    cl = clusters(init, servers=1)
    c0, c1 = cl.clients
    bad = {
        "op": "write",
        "rows": np.array([99]),
        "w": np.zeros((1, D), np.float32),
        "s": np.zeros((1, S_DIM), np.float32),
    }
    c1.t.send(cl.server_ranks[0], REQUEST, bad)
    c0.close()  # the other client ends cleanly: the failure is still what serve() reports
    with pytest.raises(BagpipeError, match=r"^serving trainer rank 1 failed: index 99 is out of bounds"):
        cl.serving[0].result()


@pytest.mark.parametrize("servers", [1, 2, 3])
def test_rows_route_to_server_g_mod_s_and_reassemble_in_order(servers, clusters):
    init = RowInitializer([6, 5], D, seed=11)  # 11 rows: shards of unequal size
    cl = clusters(init, trainers=1, servers=servers)
    c = cl.clients[0]
    ref = MemoryStore(init, S_DIM)
    rows = np.array([7, 0, 10, 3, 4, 5], np.int64)
    w, s = row_values(len(rows), 1.0)
    c.write(rows, w, s)
    ref.write(rows, w, s)
    c.flush()  # a round trip to every server, behind the writes
    for k, srv in enumerate(cl.servers):
        mine = rows[rows % servers == k]
        assert set(np.flatnonzero(srv.store.present)) == set(mine // servers)
        np.testing.assert_array_equal(srv.store.weights[mine // servers], w[rows % servers == k])
    query = np.array([10, 1, 7, 2, 0, 9], np.int64)  # written and untouched rows, unsorted
    for got, want in zip(c.read(query), ref.read(query)):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(c.peek(query), ref.peek(query)):
        np.testing.assert_array_equal(got, want)
    for a, b in [(0, 11), (3, 8), (4, 5), (5, 5), (10, 11), (1, 3)]:
        for got, want in zip(c.read_range(a, b), ref.read_range(a, b)):
            np.testing.assert_array_equal(got, want)


def test_after_finish_writes_untracked_reads_wait_for_every_clients_end(clusters, init):
    cl = clusters(init)
    c0, c1 = cl.clients
    c0.finish_writes()
    assert c0.read_floor == FINAL
    ranging = Background(lambda: c0.read_range(0, init.num_rows), "trainer 0 read_range")
    assert wait_until(lambda: cl.requests("range") == [1, 1])
    assert not ranging.finished(HELD), "served before trainer 1 finished writing"
    rows = np.array([6, 1], np.int64)
    w, s = row_values(2, 3.0)
    c1.write(rows, w, s)
    c1.finish_writes()
    got_w, got_s = ranging.result()
    np.testing.assert_array_equal(got_w[rows], w)
    np.testing.assert_array_equal(got_s[rows], s)
