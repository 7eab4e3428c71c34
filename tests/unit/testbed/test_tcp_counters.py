"""TCP's counters of an emulated host: what ``bench cluster`` reports as segments sent
again and retransmission timeouts per role.

The parser reads the kernel's ``/proc/net/snmp`` + ``/proc/net/netstat`` text (a header
line and a value line per protocol); the namespace test sends a real TCP stream between
two emulated hosts (skipped where namespaces cannot be made) and checks that the sender's
counters moved by at least the stream's segments and the receiver sent no data segments
beyond its ACKs. The last test checks that both ends of a connection between two emulated
hosts run the congestion control the net was given (set on each host's route).
"""

import subprocess
import sys

import pytest

from bagpipe.bench.scenarios.cluster.tcp import tcp_cell, tcp_figures, tcp_medians
from bagpipe.testbed import netns
from bagpipe.testbed.netns import EmulatedNet, probe_rate
from bagpipe.testbed.tcpstats import TcpCounters

pytestmark = pytest.mark.unit

SNMP = """Ip: Forwarding DefaultTTL InReceives
Ip: 2 64 2549776
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors
Tcp: 1 200 120000 -1 5405 4411 926 420 0 2547001 2530237 2599 0 1256 0
Udp: InDatagrams NoPorts
Udp: 10 0
"""
NETSTAT = """TcpExt: SyncookiesSent SyncookiesRecv TCPTimeouts TCPLossProbes
TcpExt: 0 0 4 2599
IpExt: InNoRoutes InTruncatedPkts
IpExt: 0 0
"""


def test_the_three_counters_are_read_from_the_kernels_text():
    got = TcpCounters.parse(SNMP + NETSTAT)
    # the kernel's OutSegs leaves retransmissions out: every segment sent is both together
    assert got == TcpCounters(segments=2530237 + 2599, retransmitted=2599, timeouts=4)


def test_a_difference_is_what_happened_between_two_readings():
    before = TcpCounters(100, 5, 1)
    after = TcpCounters(1100, 25, 3)
    assert after - before == TcpCounters(1000, 20, 2)
    assert tcp_figures(after - before, steps=4) == {
        "segments_per_step": 250.0,
        "retransmitted_share": 0.02,
        "timeouts_per_step": 0.5,
    }
    assert tcp_figures(TcpCounters(), steps=4)["retransmitted_share"] == 0.0  # nothing sent: no share


def test_missing_protocols_read_as_zero():
    assert TcpCounters.parse(SNMP) == TcpCounters(2530237 + 2599, 2599, 0)  # no netstat: no timeouts counted
    assert TcpCounters.parse("Tcp: OutSegs RetransSegs\n") == TcpCounters()  # a header without its values


def test_the_report_names_the_worst_host():
    tcp = {
        "trainer 0": {"segments_per_step": 9.0, "retransmitted_share": 0.036, "timeouts_per_step": 0.3},
        "trainer 1": {"segments_per_step": 9.0, "retransmitted_share": 0.086, "timeouts_per_step": 0.3},
        "server 0": {"segments_per_step": 9.0, "retransmitted_share": 0.048, "timeouts_per_step": 0.8},
    }
    assert tcp_cell({"tcp": tcp}) == "3.6% / 4.8% / 8.6% (trainer 1); 0.8"
    assert tcp_cell({}) == "not measured"  # a sweep from before the counters


@pytest.mark.skipif(netns.unavailable() is not None, reason=f"no emulated hosts here: {netns.unavailable()}")
def test_a_streams_segments_are_counted_in_its_senders_namespace():
    with EmulatedNet("tc") as net:
        a, b = net.add("a", rate_mbit=20), net.add("b", rate_mbit=20)
        before_a, before_b = net.tcp_counters(a), net.tcp_counters(b)
        mbit = probe_rate(net, a, b, seconds=0.5)
        sent_a, sent_b = net.tcp_counters(a) - before_a, net.tcp_counters(b) - before_b
    data_segments = mbit * 1e6 / 8 * 0.5 / 1448  # the stream's bytes over a full segment's payload
    assert sent_a.segments >= 0.9 * data_segments
    assert sent_b.segments < sent_a.segments  # b only acknowledges (delayed ACKs: about one per two)


def test_the_median_over_repetitions_and_runs_from_before_the_counters():
    def window(share: float) -> dict:
        return {"tcp": {"trainer 0": {"segments_per_step": 10.0, "retransmitted_share": share, "timeouts_per_step": 0}}}

    got = tcp_medians([window(0.01), window(0.05), window(0.03)])
    assert got == {"trainer 0": {"segments_per_step": 10.0, "retransmitted_share": 0.03, "timeouts_per_step": 0}}
    assert tcp_medians([{"bytes_per_step": {}}]) == {}  # a sweep from before the counters
    assert tcp_medians([]) == {}


@pytest.mark.skipif(netns.unavailable() is not None, reason=f"no emulated hosts here: {netns.unavailable()}")
@pytest.mark.parametrize("cc", ["cubic", "reno"])
def test_every_emulated_host_runs_the_congestion_control_it_was_given(cc):
    """What the sockets of a connection between two hosts run, both ends (``ss -ti`` names it)."""
    with EmulatedNet("cc", congestion_control=cc) as net:
        a, b = net.add("a", rate_mbit=20), net.add("b", rate_mbit=20)
        server = net.popen(b, [sys.executable, "-c", SERVER, b.addr], stdout=subprocess.PIPE, text=True)
        client = net.run(a, [sys.executable, "-c", CLIENT, b.addr], capture_output=True, text=True, timeout=30)
        accepted, _ = server.communicate(timeout=30)
    assert client.returncode == 0 and server.returncode == 0, client.stderr
    assert cc in client.stdout.split() and cc in accepted.split()
    assert netns.CONGESTION_CONTROL == "cubic"  # what bench cluster's hosts run unless told otherwise


SHOW = "subprocess.run(['ss', '-tin', 'state', 'established'], check=True); sys.stdout.flush()"
SERVER = f"""
import socket, subprocess, sys
c, _ = socket.create_server((sys.argv[1], 5301)).accept()
got = 0
while got < 100_000:
    got += len(c.recv(65536))
{SHOW}
c.sendall(b"k")
c.recv(1)
"""
CLIENT = f"""
import socket, subprocess, sys, time
for _ in range(100):  # until the other host listens
    try:
        s = socket.create_connection((sys.argv[1], 5301), timeout=10)
        break
    except ConnectionRefusedError:
        time.sleep(0.1)
s.sendall(b"x" * 100_000)
s.recv(1)
{SHOW}
"""
