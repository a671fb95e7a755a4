"""How long a message takes on a slow link: measured rows first, else a transport model from the spec.

Why not `bytes / bandwidth + latency`: on the links hetauto plans around, the nominal rate is rarely what a
transfer gets. Three mechanisms, each from the spec's own figures (nothing is fitted):

- **Window / RTT.** One TCP stream has at most one window in flight per round trip, so it moves at most
  `window / RTT` (RTT = 2 x the one-way latency), whatever the link's rate: 3 MiB over a 40 ms RTT is 78.6 MB/s,
  0.63 of a 1 Gbit/s link. A transport that opens `streams` TCP streams per peer pair gets `streams` windows.
  Streams per peer pair: gloo's TCP transport connects one pair (one socket) per peer in
  `gloo::Context::connectFullMesh` (facebookincubator/gloo, gloo/context.cc; torch's ProcessGroupGloo makes one
  context per listed interface), so 1; NCCL over sockets opens NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD
  sockets per connection, 1 x 1 unless a cloud is detected (docs.nvidia.com/deeplearning/nccl/user-guide/docs/
  env.html), so 1. `streams:` on a link overrides it; a link without `window:` (RDMA, or a window larger than
  rate x RTT) is not window-limited.
- **NICs shared by a node.** `inter_node.nics_per_node: k` says a node's devices share k NICs of
  `inter_node.bandwidth` each; the flows that leave (or enter) one node at once split `k x bandwidth`. A
  boundary's flows are spread over its stage's nodes (`ceil(flows / nodes)` per node); a DP ring that leaves a
  node runs beside the stage's other `tp - 1` rings (one per TP rank), so each gets `k x bandwidth / tp`. (The
  executor reduces gradients after the last backward, when the boundary is idle, so the two are not summed.)
- **Slow start after idle.** A TCP stream that has sent no data for longer than its retransmission timeout
  restarts from the initial window (RFC 2861 / RFC 5681; Linux `net.ipv4.tcp_slow_start_after_idle`, on by
  default): 10 segments (RFC 6928, Linux TCP_INIT_CWND) of `mtu - 52` bytes (IPv4 + TCP headers with
  timestamps), doubling each round trip up to the window. Linux's RTO is srtt + max(4 rttvar, 200 ms), so about
  RTT + 200 ms on a steady path. A pipeline boundary's direction idles between microbatches for its sender's
  forward + backward (one send per cycle in 1F1B), and for a whole step when there is one microbatch; when that
  exceeds the RTO every transfer pays the rounds (`slow_start_seconds`). Not under BBR: Linux's
  `tcp_slow_start_after_idle_check` (include/net/tcp.h) returns early for a congestion control with its own
  `cong_control` (BBR keeps its window after idle and paces at its bandwidth estimate); on the BBR host here,
  over the TUN-relayed link at 1 Gbit/s, 70 ms each way, 2 MiB after 2 s idle took 136-138 ms, as back to back
  (136 ms), so a spec for BBR hosts says `slow_start_after_idle: false`. (An earlier check on this host, ~250-310
  ms after idle, saw a young connection whose receive window was still opening: hetauto.launch.netns_topology, `mtu`.)
- **What a figure is per.** A `links:` entry's `per:` (hetauto.core.cluster) says what its `bandwidth` is:
  `path` (the default between clusters) the whole path, so all flows of one direction share it (the loader
  makes it the link's `shared_capacity_Bps`, which the simulator shares among the flows); `node` each node's
  own at either end, so the `ceil(flows / nodes)` flows leaving (or entering) one node split it (`flow_rate`);
  `flow` each flow's own. `read_link` says which reading priced a boundary and the aggregate it gave.
- **Blocking sends.** `blocking: true` on a link: a send holds its sender until its bytes are on the wire (a
  synchronous transport), so the transfer is exposed on the sender, not overlapped with its next compute.

Measured rows (`hetauto profile link`: `flows` concurrent messages of `bytes` each -> `seconds`) price a message
whose size lies inside the rows measured at its number of flows, interpolated linearly between the two rows
around it (the slope is the per-flow rate, the intercept the latency), never extrapolated: outside them, or at a
number of flows not measured, the transport model prices it and `LinkPrice.detail` says why. Rows measured
after an idle gap (`idle`, `hetauto profile link --idle S`) price transfers whose direction idles longer than the
RTO (RTT + 200 ms), rows measured back to back the others: a transfer after idle is not one of a busy stream
(cubic restarts from the initial window; BBR keeps its window but paces at a bandwidth estimate its last,
app-limited transfers set: over 1 Gbit/s, 70 ms each way, 2 MiB took 108 ms back to back and 144 ms in a
one-microbatch run idling ~1.5 s per step). Where the plan's regime has no rows, the other's price it, and the
detail says so.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, replace

from hetauto.core.cluster import LinkRow, LinkSpec
from hetauto.core.units import format_bandwidth, format_bytes

__all__ = ["DEFAULT_MTU", "DEFAULT_STREAMS", "INITIAL_SEGMENTS", "LinkPrice", "LinkReading", "NodeShare",
           "flow_rate", "interpolate_rows", "measured_regime", "measure_command", "price_link", "read_link",
           "ring_bandwidth", "rto_s", "slow_start_seconds"]

# TCP streams per peer pair of each transport's collective library (see the module docstring for the sources)
DEFAULT_STREAMS = 1
DEFAULT_MTU = 1500  # Ethernet
HEADER_BYTES = 52  # IPv4 20 + TCP 20 + timestamps option 12 (Linux sends timestamps by default)
INITIAL_SEGMENTS = 10  # RFC 6928; Linux TCP_INIT_CWND
RTO_MIN_S = 0.2  # Linux TCP_RTO_MIN (HZ / 5)


def rto_s(rtt: float) -> float:
    """Linux's retransmission timeout on a steady path: srtt + max(4 rttvar, 200 ms) with rttvar ~ 0."""
    return rtt + RTO_MIN_S


def slow_start_seconds(nbytes: float, rate: float, rtt: float, latency: float, initial: float,
                       window: float) -> float:
    """One stream moving `nbytes` from a congestion window of `initial` bytes: round k sends min(initial x 2^k,
    window) bytes and lasts max(RTT, those bytes / rate) (the next round starts when the first ACKs return);
    the last, partial round's bytes then cross at `rate` and arrive `latency` later."""
    sent, cwnd, t = 0.0, initial, 0.0
    while nbytes - sent > cwnd:
        sent += cwnd
        t += max(rtt, cwnd / rate)
        cwnd = min(2 * cwnd, window)
    return t + (nbytes - sent) / rate + latency


@dataclass(frozen=True, slots=True)
class NodeShare:
    """One end of a transfer: the node's inter-node link (its NICs) and how many flows leave/enter it at once."""

    nic: LinkSpec
    flows: int = 1

    def cap_Bps(self) -> float:
        """The rate each of the node's flows gets from its NICs (inf: every device has its own NIC)."""
        n = self.nic.nics_per_node
        return math.inf if n is None else n * self.nic.bandwidth_Bps / max(self.flows, 1)


@dataclass(frozen=True, slots=True)
class LinkPrice:
    """What one flow of a message gets: `bandwidth_Bps` (per flow) and `latency_s`, so one flow of `b` bytes
    takes `latency_s + b / bandwidth_Bps`; `source` "measured" (rows), "model" (a transport-model term
    applies) or "nominal" (the spec's rate and latency as they are); `detail` says which term priced it;
    `blocking`: a send holds its sender for its bytes / bandwidth."""

    bandwidth_Bps: float
    latency_s: float
    source: str
    detail: str
    blocking: bool = False

    def seconds(self, nbytes: float) -> float:
        return self.latency_s + (nbytes / self.bandwidth_Bps if nbytes and self.bandwidth_Bps != math.inf else 0.0)

    def as_link(self) -> LinkSpec:
        return LinkSpec(self.bandwidth_Bps, self.latency_s)


def flow_rate(link: LinkSpec, src: NodeShare | None = None, dst: NodeShare | None = None,
              streams: int | None = None) -> tuple[float, str]:
    """(bytes/s one flow gets, which term bounds it): min of the link's rate, `streams x window / RTT` (with a
    window and a latency) and each end's NIC share."""
    terms = [(link.bandwidth_Bps, f"nominal {format_bandwidth(link.bandwidth_Bps)}")]
    if link.window_bytes is not None and link.latency_s > 0:
        k = streams or link.streams or DEFAULT_STREAMS
        rtt = 2 * link.latency_s
        terms.append((k * link.window_bytes / rtt, f"window {k} x {format_bytes(link.window_bytes)} / "
                      f"{rtt * 1e3:g} ms RTT = {format_bandwidth(k * link.window_bytes / rtt)}"))
    for end, who in ((src, "sender"), (dst, "receiver")):
        if end is not None and link.per == "node":
            cap = link.bandwidth_Bps / max(end.flows, 1)
            terms.append((cap, f"per node: {who}'s node {format_bandwidth(link.bandwidth_Bps)} / {end.flows} "
                          f"flows = {format_bandwidth(cap)}"))
        if end is not None and end.nic.nics_per_node is not None:
            cap = end.cap_Bps()
            terms.append((cap, f"{who}'s node: {end.nic.nics_per_node} NIC x "
                          f"{format_bandwidth(end.nic.bandwidth_Bps)} / {end.flows} flows = {format_bandwidth(cap)}"))
    rate, why = min(terms, key=lambda t: t[0])
    return rate, why


def interpolate_rows(rows: tuple[LinkRow, ...], nbytes: float, flows: int) -> tuple[float, float] | str:
    """(per-flow bandwidth B/s, latency s) of the line through the two rows at `flows` around `nbytes`, or why
    the rows do not cover it (no extrapolation). A falling or flat segment (timing noise) gives inf bandwidth
    and the interpolated time as latency."""
    at = sorted((r for r in rows if r.flows == flows), key=lambda r: r.nbytes)
    if not at:
        have = sorted({r.flows for r in rows})
        return f"no rows at {flows} flows (measured: {', '.join(map(str, have))})"
    lo, hi = at[0].nbytes, at[-1].nbytes
    if not lo <= nbytes <= hi:
        return (f"{format_bytes(nbytes)} per flow is outside the rows measured at {flows} flows "
                f"({format_bytes(lo)}..{format_bytes(hi)}; no extrapolation)")
    if len(at) == 1:
        return math.inf, at[0].seconds
    sizes = [r.nbytes for r in at]
    j = min(max(bisect_left(sizes, nbytes), 1), len(at) - 1)
    a, b = at[j - 1], at[j]
    slope = (b.seconds - a.seconds) / (b.nbytes - a.nbytes)
    if slope <= 0:
        return math.inf, a.seconds + slope * (nbytes - a.nbytes)
    return 1.0 / slope, a.seconds - slope * a.nbytes


def measured_regime(link: LinkSpec, idle_s: float) -> tuple[tuple[LinkRow, ...], str]:
    """The rows of `link` measured in the idle regime of a transfer idling `idle_s` (after idle: longer than
    the RTO; else back to back), and a note for the detail; all rows, said so, when none are in it."""
    if not any(r.idle_s for r in link.measured):
        return link.measured, ""  # rows of one regime only (back to back): as before
    rto = rto_s(2 * link.latency_s)
    after = idle_s > rto
    rows = tuple(r for r in link.measured if (r.idle_s > rto) == after)
    if not rows:
        return link.measured, (f" (none measured {'after idle' if after else 'back to back'}: "
                               f"idle {idle_s * 1e3:.4g} ms vs RTO {rto * 1e3:.4g} ms)")
    return rows, " after idle" if after else " back to back"


def price_link(link: LinkSpec, nbytes: float, flows: int = 1, src: NodeShare | None = None,
               dst: NodeShare | None = None, streams: int | None = None, idle_s: float = 0.0) -> LinkPrice:
    """One flow of `nbytes` among `flows` concurrent ones on `link`: measured rows where they cover it, else the
    transport model (`flow_rate`; after `idle_s` without sending, longer than the RTO on a TCP link with
    `slow_start_after_idle`: from the initial window, `slow_start_seconds`)."""
    note = ""
    if link.measured:
        rows, regime = measured_regime(link, idle_s)
        got = interpolate_rows(rows, nbytes, flows)
        if not isinstance(got, str):
            bw, lat = got
            return LinkPrice(bw, lat, "measured", f"measured rows at {flows} flows{regime}", link.blocking)
        note = got + "; "
    rate, why = flow_rate(link, src, dst, streams)
    modelled = (link.window_bytes is not None or link.blocking or link.per == "node" or any(
        e is not None and e.nic.nics_per_node is not None for e in (src, dst)))
    source = "model" if modelled or note else "nominal"
    latency = link.latency_s
    rtt = 2 * link.latency_s
    if (link.window_bytes is not None and link.slow_start_after_idle and rtt > 0 and idle_s > rto_s(rtt)
            and rate != math.inf):
        k = streams or link.streams or DEFAULT_STREAMS
        mss = (link.mtu or DEFAULT_MTU) - HEADER_BYTES
        # each of the k streams carries nbytes / k, each from its own initial window
        # rounds move at the line's rate (the window caps the congestion window instead)
        line, _ = flow_rate(replace(link, window_bytes=None), src, dst, streams)
        t = slow_start_seconds(nbytes / k, line / k, rtt, link.latency_s, INITIAL_SEGMENTS * mss,
                               link.window_bytes)
        if t > link.latency_s + nbytes / rate:
            latency = t - nbytes / rate  # the extra rounds ride in the latency: the link is not busy during them
            why += (f"; idle {idle_s * 1e3:.4g} ms > RTO {rto_s(rtt) * 1e3:.4g} ms: slow start from "
                    f"{INITIAL_SEGMENTS} x {mss} B")
    return LinkPrice(rate, latency, source, note + why + (", blocking sends" if link.blocking else ""),
                     link.blocking)


def ring_bandwidth(nic: LinkSpec, rings_per_node: int) -> float:
    """Per-hop bandwidth of a ring that leaves a node beside `rings_per_node - 1` others: the NIC's, or its
    share of the node's NICs when they are shared (`nics_per_node`)."""
    if nic.nics_per_node is None:
        return nic.bandwidth_Bps
    return min(nic.bandwidth_Bps, nic.nics_per_node * nic.bandwidth_Bps / max(rings_per_node, 1))


READINGS = {"path": "shared path", "node": "per node", "flow": "per flow"}


@dataclass(frozen=True, slots=True)
class LinkReading:
    """How a cross-cluster boundary read its link's figure: `per` ("path", "node", "flow"; `label` in words),
    `aggregate_Bps` all the boundary's flows together got (flows x one flow's rate, capped by the path's
    capacity), and whether it was priced from a datasheet figure (`datasheet`: no measured row covered it and
    no `window:`), then `measure`, the `hetauto profile link` command that would settle it."""

    per: str
    label: str
    aggregate_Bps: float
    datasheet: bool
    measure: str = ""
    between: tuple[str, str] = ("", "")

    def seconds(self, price: LinkPrice, flows: int, flow_bytes: float) -> float:
        """One microbatch's `flows` x `flow_bytes` one way at the aggregate (no faster than one flow alone)."""
        if not flow_bytes or self.aggregate_Bps == math.inf:
            return price.seconds(flow_bytes)
        return max(price.seconds(flow_bytes), price.latency_s + flows * flow_bytes / self.aggregate_Bps)

    def as_dict(self) -> dict[str, object]:
        return {"between": list(self.between), "per": self.per, "reading": self.label,
                "aggregate_Bps": self.aggregate_Bps, "datasheet": self.datasheet, "measure": self.measure}


def read_link(link: LinkSpec, price: LinkPrice, flows: int, between: tuple[str, str], flow_bytes: float,
              spec_path: str | None) -> LinkReading:
    """The reading of `link` for a boundary of `flows` flows of `flow_bytes` each that `price` priced."""
    aggregate = min(flows * price.bandwidth_Bps, link.shared_capacity_Bps or math.inf)
    label = READINGS[link.per]
    if link.per == "path":
        label += f": {format_bandwidth(link.bandwidth_Bps)} " + (f"shared by {flows} flows" if flows > 1 else "(1 flow)")
    elif link.per == "node":
        label += f": {format_bandwidth(link.bandwidth_Bps)} per node at each end"
    else:
        label += f": {format_bandwidth(link.bandwidth_Bps)} each" + (
            f", all capped at {format_bandwidth(link.shared_capacity_Bps)}" if link.shared_capacity_Bps else "")
    datasheet = price.source != "measured" and link.window_bytes is None
    command = measure_command(between, flows, flow_bytes, spec_path) if datasheet else ""
    return LinkReading(link.per, label, aggregate, datasheet, command, between)


def measure_command(between: tuple[str, str], flows: int, flow_bytes: float, spec_path: str | None) -> str:
    """The sending side's `hetauto profile link` that measures rows around `flow_bytes` at `flows` flows and
    writes them into the spec's link entry (its receiver runs `--rank 1 --master HOST:PORT` first)."""
    import shlex

    lo = 2 ** math.floor(math.log2(max(flow_bytes, 1)))
    hi = 2 ** math.ceil(math.log2(max(flow_bytes, 1)))
    if lo == hi:  # rows must bracket the size: no extrapolation
        lo, hi = max(lo // 2, 1), hi * 2
    # a scenario's spec is no file to write rows into: a placeholder for the user's copy of it
    is_file = spec_path is not None and spec_path.lower().endswith((".yaml", ".yml", ".json"))
    spec = shlex.quote(spec_path) if is_file else "CLUSTER.yaml"
    return (f"hetauto profile link --rank 0 --master HOST:PORT --sizes {_size(lo)},{_size(hi)} --flows {flows} "
            f"--spec {spec} --between {shlex.quote(between[0])} {shlex.quote(between[1])}")


def _size(n: int) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f}{unit}"
    return f"{n}B"
