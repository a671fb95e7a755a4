"""The evaluator's links section: what each pipeline boundary's link costs one microbatch each way (network,
resharding's local step, host copies; shared capacity groups), and the collectives a stage's DP group and the
tied embedding table run over their links.

The one place that calls into hetauto.planner.linkmodel (`link_price`: `price_link`; `dp_link`:
`ring_bandwidth`). Why its own class: a boundary's price depends on the two stages and the bytes alone (and, on a
link that restarts from slow start, on how long it idles), so it is cached by those and shared by every plan
that has that boundary.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from hetauto.core.cluster import Cluster, LinkSpec
from hetauto.core.plan import Plan, StagePlan
from hetauto.core.precision import DTYPE_BYTES, HOST_BACKENDS, compute_bytes
from hetauto.core.stage_backends import builtin_transport_kind
from hetauto.planner import costmodel as cm
from hetauto.planner.evaluation import BoundaryLink
from hetauto.planner.linkmodel import LinkPrice, NodeShare, price_link, read_link, ring_bandwidth
from hetauto.planner.stage_compute import ComputePricer
from hetauto.schedule import Link, PipelineCosts

if TYPE_CHECKING:
    from hetauto.planner.calibration import Overheads

__all__ = ["LinkPricer", "fold_groups"]


class LinkPricer:
    """Boundary links and DP / tied-table collectives of one PlanningInputs' plans (see the module docstring).
    `overheads`: a calibrated executor's fixed per-message and per-collective costs (None: none)."""

    def __init__(self, compute: ComputePricer, overheads: "Overheads | None" = None) -> None:
        self.compute = compute
        self.overheads = overheads
        self._links: dict[tuple, tuple[Link, Link, dict[str, float]]] = {}
        self._nodes: dict[tuple[str, tuple[int, ...]], frozenset[int]] = {}  # `nodes_of`
        self._tied: dict[tuple, float] = {}  # `tied_sum_s` by the first and last stages' clusters and devices
        # whether any cross-cluster link may restart from slow start (a TCP window, the restart on) or has rows
        # measured after idle: only then do boundary prices depend on the plan's stage times (and the link cache
        # key on them)
        spec = compute.inputs.cluster
        self.slow_start = any((ln.window_bytes is not None and ln.slow_start_after_idle)
                              or any(r.idle_s for r in ln.measured)
                              for ln in (spec.default_link, *(o[2] for o in spec.overrides)) if ln is not None)

    def boundary(self, a: StagePlan, b: StagePlan, method: str, nbytes: float,
                  idle_s: float = 0.0) -> tuple[Link, Link, dict[str, float]]:
        """(forward link a->b, backward link b->a, {shared group: capacity in 'S-bytes'/s}).

        A boundary between two backends goes through the `host` transport (`host_links`): each message also pays
        the sender's device->host and the receiver's host->device copy, serial with the network transfer; the
        link's bandwidth is the slowest of the three, the rest is latency (`mk`), so the simulator and the
        fast path price the same link.

        A cross-cluster link with `shared_capacity_Bps` caps all flows of one direction between the two
        clusters (full duplex: each direction has the capacity). Its group is named by the direction and
        by the bytes-on-the-wire factor (lanes send tp_d copies), so the capacity is in units of S."""
        key = (a.cluster, a.devices, a.dp, a.tp, b.cluster, b.devices, b.dp, b.tp, method, nbytes, idle_s)
        hit = self._links.get(key)
        if hit is not None:
            return hit
        ca, cb = self.compute.cluster(a.cluster), self.compute.cluster(b.cluster)
        link, price, _ = self.link_price(a, b, method, nbytes, idle_s)
        shared = link.shared_capacity_Bps if ca.name != cb.name else None
        link = price.as_link()
        out_a, in_b = self.host_links(ca.name, cb.name)
        fwd = cm.boundary_cost(method, nbytes, (a.dp, a.tp), (b.dp, b.tp), link, cb.intra_node, (out_a, in_b))
        bwd = cm.boundary_cost(method, nbytes, (b.dp, b.tp), (a.dp, a.tp), link, ca.intra_node, (in_b, out_a))
        groups: dict[str, float] = {}

        oh = self.overheads
        alpha = 0.0 if oh is None else oh.p2p_alpha_s + (oh.link_lag_s if ca.name != cb.name else 0.0)

        def mk(bc: cm.BoundaryCost, src: str, dst: str) -> Link:
            # a message holds the link for the slowest of copy-out, wire and copy-in (BoundaryCost.busy_s) and
            # arrives after all three: the other two ride in the latency, so bytes / bw + latency = total_s
            busy = bc.busy_s
            bw = nbytes / busy if busy > 0 else math.inf
            # a blocking send holds its sender until its bytes are out (linkmodel): the serialization
            held = bc.serial_s if price.blocking else 0.0
            bc = replace(bc, latency_s=bc.latency_s + alpha + bc.copy_out_s + bc.serial_s + bc.copy_in_s - busy)
            group = None
            if shared is not None and nbytes > 0:
                factor = bc.cross_bytes / nbytes
                group = f"{src}->{dst}x{factor:g}"
                groups[group] = shared / factor
            return Link(bc.latency_s, bw, group, nbytes / held if held > 0 else math.inf)

        hit = (mk(fwd, ca.name, cb.name), mk(bwd, cb.name, ca.name), groups)
        self._links[key] = hit
        return hit

    def link_price(self, a: StagePlan, b: StagePlan, method: str, nbytes: float,
                    idle_s: float = 0.0) -> tuple[LinkSpec, LinkPrice, BoundaryLink]:
        """(the spec's link, what one flow gets on it, the breakdown's record) for boundary a -> b: between two
        clusters their link, inside one its inter-node link (NICs shared by the flows of one node) or, on one
        node, its intra-node link (nominal). hetauto.planner.linkmodel prices it: measured rows first; `idle_s`:
        how long each direction goes without sending (`idle_s`), for TCP's slow start after idle."""
        ca, cb = self.compute.cluster(a.cluster), self.compute.cluster(b.cluster)
        flows, flow_bytes = cm.boundary_flows(method, nbytes, (a.dp, a.tp), (b.dp, b.tp))

        def share(st: StagePlan, c: Cluster) -> NodeShare:
            nodes = len(self.nodes_of(c, st.devices))
            return NodeShare(c.inter_node, -(-flows // max(nodes, 1)))

        if ca.name != cb.name:
            link, kind = self.compute.inputs.cluster.link(ca.name, cb.name), "cross-cluster"
            price = price_link(link, flow_bytes, flows, share(a, ca), share(b, cb), idle_s=idle_s)
        else:
            nodes = self.nodes_of(ca, a.devices) | self.nodes_of(ca, b.devices)
            if len(nodes) == 1:
                link, kind = ca.intra_link(a.devices[0]), "intra-node"
                price = LinkPrice(link.bandwidth_Bps, link.latency_s, "nominal", "intra-node link")
            else:
                link, kind = ca.inter_node, "inter-node"
                price = price_link(link, flow_bytes, flows, share(a, ca), share(b, cb))
        info = BoundaryLink(-1, kind, price.source, price.detail, flows, flow_bytes, price.seconds(flow_bytes))
        return link, price, info

    def nodes_of(self, c: Cluster, devices: tuple[int, ...]) -> frozenset[int]:
        """The nodes of cluster `c` holding `devices`, kept per (cluster, devices): every boundary of a stage asks
        (4096 devices: a Python step per device per boundary priced)."""
        key = (c.name, devices)
        hit = self._nodes.get(key)
        if hit is None:
            hit = self._nodes[key] = frozenset(map(c.node_of, devices))
        return hit

    def link_prices(self, plan: Plan, costs: PipelineCosts) -> tuple[BoundaryLink, ...]:
        """How each of `plan`'s boundaries was priced (which source, which term), in boundary order; `costs`:
        the plan's per-stage costs (their F and B say how long a direction idles, for slow start)."""
        methods = plan.boundary_methods()
        table = self.compute.layer_table(self.compute.precision(plan))
        idle = self.idle_s(plan, costs.tf, costs.tb) if self.slow_start else 0.0
        out = []
        for h in range(plan.num_stages - 1):
            a, b = plan.stages[h], plan.stages[h + 1]
            s = table.range(*a.layers).boundary_bytes_per_sample * plan.microbatch_size
            link, price, info = self.link_price(a, b, methods[h], s, idle)
            if info.kind == "cross-cluster":  # its reading; its time at the aggregate (a shared path's flows queue)
                reading = read_link(link, price, info.flows, (a.cluster, b.cluster), info.flow_bytes,
                                    self.compute.inputs.cluster.source)
                info = replace(info, reading=reading, seconds=reading.seconds(price, info.flows, info.flow_bytes))
            out.append(replace(info, boundary=h))
        return tuple(out)

    @staticmethod
    def idle_s(plan: Plan, tf: "tuple[float, ...] | list[float]", tb: "tuple[float, ...] | list[float]") -> float:
        """How long a boundary's direction goes without sending, for TCP's slow start after idle (linkmodel):
        in a pipeline's steady state one send per cycle of the slowest stage (its forward + backward); with one
        microbatch a whole step (at least every stage's forward and backward). The first transfer after a step's
        end idles longer; it is one of m and is not told apart."""
        if plan.num_microbatches > 1:
            return max(f + b for f, b in zip(tf, tb))
        return sum(tf) + sum(tb)

    def host_links(self, src: str, dst: str) -> tuple[float, float]:
        """(sender's, receiver's) host-link bandwidth for the boundary src -> dst (cluster names): (inf, inf) when
        both run on one backend (`builtin_transport_kind` "device": no host copies), else each side's profile
        `host_link_bandwidth`, inf on a host-CPU backend (cpu, mock: its tensors are already in host memory)."""
        spec = self.compute.inputs.cluster
        ba, bb = spec.cluster(src).backend, spec.cluster(dst).backend
        if builtin_transport_kind(ba, bb) != "host":
            return (math.inf, math.inf)

        def side(name: str, backend: str) -> float:
            return math.inf if backend in HOST_BACKENDS else self.compute.cluster(name).device.host_link_bandwidth_Bps

        return (side(src, ba), side(dst, bb))

    def dp_link(self, st: StagePlan) -> "LinkSpec | None":
        """The link a mixed cluster's DP group spans (intra-node when all its devices share a node); None: the
        cost model's contiguous-devices rule (costmodel.group_link). A ring that leaves its node on NICs the
        node's devices share (`inter_node.nics_per_node`) gets its share beside the stage's other TP ranks'
        rings (linkmodel.ring_bandwidth)."""
        c = self.compute.cluster(st.cluster)
        link = cm.spanned_link(c, st.devices) if c.is_mixed else None
        if st.dp > 1 and c.inter_node.nics_per_node is not None:
            crosses = (link is c.inter_node) if link is not None else st.tp * st.dp > c.devices_per_node
            if crosses:
                bw = ring_bandwidth(c.inter_node, min(st.tp, c.devices_per_node))
                return LinkSpec(bw, c.inter_node.latency_s)
        return link

    def dp_group_link(self, st: StagePlan, c: Cluster) -> tuple[float, float]:
        """(bandwidth B/s, latency s) of `st`'s DP group, as the all-reduce is priced: the measured collective
        where the Evaluator has one, else the link a mixed group spans, else the contiguous-devices rule."""
        oh = self.overheads
        if oh is not None and oh.allreduce_Bps > 0:
            return oh.allreduce_Bps, oh.allreduce_alpha_s / 2
        span = self.dp_link(st)
        link = span if span is not None else cm.group_link(c, st.tp * st.dp)
        return link.bandwidth_Bps, link.latency_s

    def shard_comm(self, plan: Plan, st: StagePlan, c: Cluster | None = None) -> cm.ShardComm:
        """`st`'s ZeRO-2 / FSDP collectives (costmodel.dp_shard_comm) over its DP group's link, gathered in the
        plan's compute dtype and reduced in its grad_reduce_dtype; all zero for none and zero1."""
        if plan.dp_level in ("none", "zero1") or st.dp <= 1:
            return cm.ShardComm()
        c = c if c is not None else self.compute.cluster(st.cluster)
        prec = self.compute.precision(plan)
        bw, lat = self.dp_group_link(st, c)
        return cm.dp_shard_comm(self.compute.layer_table(prec).range(*st.layers), tp=st.tp, dp=st.dp, level=plan.dp_level,
                                gather_bytes=compute_bytes(prec),
                                grad_bytes=DTYPE_BYTES[plan.training.grad_reduce_dtype], bandwidth_Bps=bw,
                                latency_s=lat)

    def tied_sum_s(self, plan: Plan) -> float:
        """The tied table's gradient sum between the embedding stage and the head stage, as the executor runs it
        (hetauto.runtime.executor `_reduce_grads`, the group from runtime.groups `build_groups`): after the DP
        sum, one all-reduce of the whole vocab x hidden table in fp32 (the master gradient, whatever
        grad_reduce_dtype; the table is never TP-sharded) over one host-collective (gloo) group of *every* rank
        of the first and the last stage (each end's dp 0 / tp 0 rank contributes its copy, the others zeros),
        in rank order: a ring whose hops are the links between consecutive devices (`_tied_ring`), so the
        link between the two stages' clusters paces it and pays its latency 4 times. On an accelerator the
        table is also copied to host memory (the contributors) and back (every rank) over `host_link_bandwidth`.
        0 without a tied table split across stages."""
        head = self.compute.inputs.layers[-1]
        if plan.num_stages < 2 or head.kind != "head" or head.tied_params <= 0:
            return 0.0
        first, last = plan.stages[0], plan.stages[-1]
        key = (first.cluster, first.devices, first.num_devices, last.cluster, last.devices, last.num_devices)
        hit = self._tied.get(key)
        if hit is None:
            hit = self._tied[key] = self._tied_sum(first, last, head.tied_params)
        return hit

    def _tied_sum(self, first: StagePlan, last: StagePlan, tied_params: int) -> float:
        """`tied_sum_s` of a plan whose first and last stages are `first` and `last`."""
        nbytes = tied_params * DTYPE_BYTES["fp32"]
        oh = self.overheads
        if oh is not None and oh.allreduce_Bps > 0 and first.cluster == last.cluster:  # measured gloo on this host
            t = cm.ring_allreduce_time(nbytes, first.num_devices + last.num_devices, oh.allreduce_Bps,
                                       oh.allreduce_alpha_s / 2)
        else:
            t = cm.ring_allreduce_time_over(nbytes, self.tied_ring(first, last))
        spec = self.compute.inputs.cluster

        def host_bw(st: StagePlan) -> float:
            return math.inf if spec.cluster(st.cluster).backend in HOST_BACKENDS else \
                self.compute.cluster(st.cluster).device.host_link_bandwidth_Bps

        copy = nbytes / min(host_bw(first), host_bw(last))  # out on the contributors, then in on every rank
        return t + 2 * copy

    def tied_ring(self, first: StagePlan, last: StagePlan) -> list[tuple[float, float]]:
        """(bandwidth, latency) of each hop of the tied sum's ring: first stage's devices then the last's, back
        to the first. Consecutive devices of one node: the intra-node link (an upper bound for gloo, which goes
        through host memory there; the sum is priced by the measured gloo figure instead where the Evaluator
        has one), of one cluster: its inter-node link, of two clusters: the link between them."""
        members = [(first.cluster, d) for d in first.devices] + [(last.cluster, d) for d in last.devices]
        hops = []
        for (ca, da), (cb, db) in zip(members, members[1:] + members[:1]):
            if ca != cb:
                ln = self.compute.inputs.cluster.link(ca, cb)
            else:
                c = self.compute.cluster(ca)
                ln = c.intra_link(da) if c.node_of(da) == c.node_of(db) else c.inter_node
            hops.append((ln.bandwidth_Bps, ln.latency_s))
        return hops

def fold_groups(links: list[Link | None], back: list[Link | None],
                 groups: dict[str, float]) -> tuple[list[Link | None], list[Link | None], dict[str, float]]:
    """Fold every group used by exactly one directed link into that link: bandwidth min(bw, capacity).

    Why exact: the simulator passes a transfer through its link FIFO (bytes/bw) and its group FIFO
    (bytes/capacity); with one link in the group both FIFOs see the same transfers in the same order, so
    the later of the two ends is a single FIFO at the smaller of the two rates."""
    users: dict[str, int] = {}
    for ln in (*links, *back):
        if ln is not None and ln.group is not None:
            users[ln.group] = users.get(ln.group, 0) + 1

    def fold(ln: Link | None) -> Link | None:
        if ln is None or ln.group is None or users[ln.group] != 1:
            return ln
        return replace(ln, bandwidth=min(ln.bandwidth, groups[ln.group]), group=None)

    kept = {g: c for g, c in groups.items() if users.get(g, 0) > 1}
    return [fold(x) for x in links], [fold(x) for x in back], kept
