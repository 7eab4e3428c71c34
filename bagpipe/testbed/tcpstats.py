"""TCP's counters of a network namespace (``/proc/net/snmp``, ``/proc/net/netstat``): what
``bench cluster`` reports per host as segments sent, retransmissions and retransmission
timeouts (read by :meth:`bagpipe.testbed.netns.EmulatedNet.tcp_counters`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TcpCounters:
    """A namespace's TCP counters (``/proc/net/snmp``, ``/proc/net/netstat``): segments sent
    (every one: new data, pure ACKs and control, and retransmissions), segments sent again
    (lost, or taken for lost), and retransmission timeouts (a sender that heard nothing for
    an RTO, at least 200 ms, and starts over from one segment). The kernel's ``OutSegs``
    leaves retransmissions out, so ``segments`` is ``OutSegs + RetransSegs``."""

    segments: int = 0
    retransmitted: int = 0
    timeouts: int = 0

    @classmethod
    def parse(cls, text: str) -> TcpCounters:
        """From the text of ``/proc/net/snmp`` and ``/proc/net/netstat`` (a header line and a
        value line per protocol)."""
        lines = [line.split() for line in text.splitlines() if line.strip()]
        fields: dict[str, int] = {}
        for head, values in zip(lines, lines[1:]):
            if head[0] not in ("Tcp:", "TcpExt:") or values[0] != head[0] or len(head) != len(values):
                continue
            try:
                numbers = [int(v) for v in values[1:]]
            except ValueError:  # a header followed by a header: not this pair
                continue
            fields.update({f"{head[0]}{k}": n for k, n in zip(head[1:], numbers)})
        return cls(
            segments=fields.get("Tcp:OutSegs", 0) + fields.get("Tcp:RetransSegs", 0),
            retransmitted=fields.get("Tcp:RetransSegs", 0),
            timeouts=fields.get("TcpExt:TCPTimeouts", 0),
        )

    def __sub__(self, other: TcpCounters) -> TcpCounters:
        return TcpCounters(
            self.segments - other.segments, self.retransmitted - other.retransmitted, self.timeouts - other.timeouts
        )
