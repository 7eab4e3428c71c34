"""A run's TCP figures per host, from its namespaces' counters (:class:`~bagpipe.testbed.tcpstats.TcpCounters`):
what the window records (:func:`tcp_figures`), the median over repetitions and the report's cell."""

from __future__ import annotations

from bagpipe.bench.harness.report import median_spread
from bagpipe.testbed.tcpstats import TcpCounters

SHOWN = ("trainer 0", "server 0")  # named in the report's cell beside the worst host


def tcp_figures(d: TcpCounters, steps: int) -> dict[str, float]:
    """A host's TCP over a run: segments sent per step (pure ACKs and retransmissions
    included), the share of them that were retransmissions, and retransmission timeouts per
    step (each a stall of at least 200 ms, real time)."""
    return {
        "segments_per_step": d.segments / steps,
        "retransmitted_share": d.retransmitted / d.segments if d.segments else 0.0,
        "timeouts_per_step": d.timeouts / steps,
    }


def tcp_medians(windows: list[dict]) -> dict[str, dict[str, float]]:
    """Every host's TCP figures (:func:`tcp_figures`), the median over the repetitions;
    empty for runs from before they were counted."""
    hosts = windows[0].get("tcp", {}) if windows else {}
    return {
        host: {k: median_spread([w["tcp"][host][k] for w in windows if host in w.get("tcp", {})])[0] for k in figures}
        for host, figures in hosts.items()
    }


def tcp_cell(v: dict) -> str:
    """Retransmitted segments (share of those sent) of trainer 0, server 0 and the host
    with the largest share, and the most retransmission timeouts per step of any host."""
    tcp = v.get("tcp") or {}
    if not tcp:
        return "not measured"
    worst = max(tcp, key=lambda h: tcp[h]["retransmitted_share"])
    shares = " / ".join(f"{tcp[h]['retransmitted_share']:.1%}" if h in tcp else "-" for h in SHOWN)
    timeouts = max(x["timeouts_per_step"] for x in tcp.values())
    return f"{shares} / {tcp[worst]['retransmitted_share']:.1%} ({worst}); {timeouts:.1f}"
