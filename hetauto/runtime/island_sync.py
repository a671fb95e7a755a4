"""The outer sync inside a rank of an island run (hetauto.core.islands; the run's `island` section): after each
inner step, the due fragments' DiLoCo outer step, so that every island continues from the same parameters.

Per due fragment, for each holder group this rank's stage belongs to (hetauto.runtime.island_holders, in the
global order): every dp-0 rank computes its pseudo-gradient (OuterOptimizer.pseudo_gradient on the slice it
holds); TP shards are gathered to full tensors; the stage's holder encodes them once in its island's format
(`contribution_format`), all-gathers the payloads with the other islands' holders (hetauto.runtime.island_exchange),
decodes every island's contribution (its own too, so all islands merge the same values) and merges them in island
order with the token weights; the merged full tensors are broadcast to every rank of the stage (tp x dp) and each
rank steps its own slice with the outer optimizer. Every island then holds the same parameters bit for bit.

Why on every rank, not only on holders: the outer optimizer's global copy and momentum live beside each rank's own
shard (hetauto.runtime.outer_sync), so no rank ever needs the whole model, and DP replicas stay identical.

Overlap (Streaming DiLoCo's tau, `outer.overlap_steps`; torchft's `fragment_sync_delay`): the pseudo-gradients
are taken and the holders' exchanges posted after step s - tau (gloo runs them on its own threads; each holder
posts its groups in the global order), inner steps go on, and after step s the rank waits for them, merges,
broadcasts and lands the outer step (`settle`, `_land`): the fragment becomes the new global values (or
lerp(global, local, alpha)), dropping the local progress of the tau steps, as torchft does. One fragment is in
flight at a time (tau < H // F). tau = 0 is the blocking sync of before, step for step.

Records: each holder reports one row per (step, fragment) it synced (`RankReport.outer_syncs`; `step`: the step
its outer step landed after): its payload bytes times its peers, `sync_s` the seconds of the whole sync
(pseudo-gradients, encode, the exchange until it finished, decode, merge, stage broadcast, outer step; waiting for a
slower island included) and `exposed_s` the seconds training stood still for it: the same wall time with tau = 0;
with tau > 0 this rank's own work for the sync plus the time it actually waited for the exchange after step s.
`phases` says where the sync's seconds went (`InFlight.phases`). Emulating in-process, each exchange lasts at
least the cluster file's link time for its bytes (island_exchange).
A lost island (issue 41 item 6): when a holder's exchange fails, the survivors agree the next membership epoch on
the outer store (hetauto.runtime.island_members), each holder re-forms its groups in that epoch when it next uses
them, resends the payload it kept, and merges the members' contributions with their token weights renormalised:
the survivors train on, equal bit for bit; their sync row says who was dropped (`dropped`, `epoch`, `recovery_s`).
Not supported yet, refused at start in one line: FSDP (parameters sharded over DP), non-fp32 master weights.
Checkpoints hold the outer optimizer's state (hetauto.runtime.checkpoint_outer, which reads `params`, `alias`,
`outer` and `formats` here), so a resumed island run continues exactly.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import torch

from hetauto.core.errors import PlanMismatch
from hetauto.core.islands import IslandPlan
from hetauto.core.run_config import RunConfig
from hetauto.core.transport import HOST_COLLECTIVE
from hetauto.runtime.island_exchange import Landed, OuterGroup, PeerLost, PendingExchange, open_store, pack, \
    packed_bytes, unpack
from hetauto.runtime.island_inflight import InFlight, InFlightPart
from hetauto.runtime.island_holders import HolderGroup, groups_of, holder_groups
from hetauto.runtime.island_beat import BeatWatch, Heartbeat, store_reader
from hetauto.runtime.island_members import DONE_KEY, Admission, Membership, ask_to_join, comes_back, \
    member_weights, newest, next_members, offer_admission, record_process
from hetauto.runtime.layout import placement
from hetauto.runtime.links import EmulatedLink
from hetauto.runtime.outer_sync import OuterOptimizer, due_fragments, fragment_slots, merge, sending_fragments
from hetauto.runtime.wire_codec import contribution_format

if TYPE_CHECKING:
    from hetauto.runtime.executor import StageExecutor

__all__ = ["BUCKET_BYTES", "IslandSync", "island_sync_for"]

# fp32 bytes of whole tensors per exchange and stage broadcast (the transients a sync holds at once)
BUCKET_BYTES = 64 * 2**20


def island_sync_for(ex: "StageExecutor", run: RunConfig) -> "IslandSync | None":
    """The executor's outer sync for an island run (built collectively by every rank of the island), else None."""
    return IslandSync(ex, run) if run.island.active else None


def _slot(name: str) -> int:
    return int(name.split(".")[1])  # canonical names: layers.<slot>.<...>


class IslandSync:
    """One rank's side of the outer sync; `after_step(step)` runs the due fragments, `records` what it measured."""

    def __init__(self, ex: "StageExecutor", run: RunConfig, plan: IslandPlan | None = None) -> None:
        self.run, self.me, self.world = run, ex.me, ex.g.world
        self.plan = plan if plan is not None else IslandPlan.load(run.island.plan)
        self.index = run.island.index
        _check_supported(self.plan, self.index, ex, run)
        self.name = self.plan.islands[self.index].name
        self.outer_cfg = self.plan.outer
        # tied tables: both copies by their own canonical names (the slot that holds each), whatever the layout;
        # where one tensor has both names, the outer optimizer steps it once (`alias`: name -> the name it steps)
        self.stage = ex.stage
        self.params = dict(ex.stage.named_parameters(remove_duplicate=False))
        first: dict[int, str] = {}
        self.alias = {n: first.setdefault(id(p), n) for n, p in self.params.items()}
        self.tied_head = f"layers.{ex.cfg.num_layer_slots - 1}.proj.weight" if ex.cfg.tie_embeddings else None
        self.outer = OuterOptimizer({n: _local(p) for n, p in self.params.items() if self.alias[n] == n},
                                    lr=self.outer_cfg.optimizer.lr, momentum=self.outer_cfg.optimizer.momentum)
        self.fragments = fragment_slots(ex.cfg.num_layer_slots, self.outer_cfg.fragments)
        self.holder = self.me.layout.rank(0, 0)
        self.is_holder = self.me.rank == self.holder
        self.groups = groups_of(self.plan, self.index, self.holder)
        self.by_key = {g.key: g for g in self.groups}
        # who syncs (hetauto.runtime.island_members): every island until one is lost, then the survivors
        self.membership = Membership(0, tuple(range(len(self.plan.islands))))
        self.weights = self.plan.token_weights()
        self.formats = [contribution_format(self.plan, isl.name) for isl in self.plan.islands]
        self.records: list[dict[str, Any]] = []
        self.inflight: InFlight | None = None  # the fragment sent and not landed yet (tau > 0, or a resume)
        self.stage_comm = self._stage_groups(ex)
        self._store, self._outer, self._cluster = None, {}, None
        self._beat: Heartbeat | None = None  # this island's liveness on the outer store (holders only)
        self._retired: list[OuterGroup] = []  # a lost epoch's groups: kept, so no destructor waits on a dead peer
        self.taken_back_after: int | None = None  # an island taken back: the step after which it rejoined
        self._incoming: list[tuple[list[str], torch.Tensor]] = []  # its state from the members, to take
        if self.is_holder:
            self._join(ex)

    # ------------------------------------------------------------------ set-up
    def _stage_groups(self, ex: "StageExecutor") -> Any:
        """Per stage of the island with several ranks, a host group over its ranks (the merged tensors' broadcast);
        collective over the island's world, every rank in the same order. This rank's own, or None."""
        mine = None
        for lay in ex.g.layouts:
            if len(lay.ranks) < 2:
                continue
            comm = self.world.new_group(list(lay.ranks), backend=HOST_COLLECTIVE)
            if self.me.rank in lay.ranks:
                mine = comm
        return mine

    def _join(self, ex: "StageExecutor") -> None:
        """Serve (island 0's rank 0) or reach the outer store, then join this holder's groups in the global order,
        checking that every island holds the same tensors for them."""
        timeout = self.run.training.timeout_s
        master = self.index == 0 and self.me.rank == 0
        self._store = open_store(self.run.island.store, master=master, timeout_s=timeout)
        self._cluster = cluster = self._emulated_cluster(ex)
        record_process(self._store, self.run.island.store, self.plan.islands[0].name, self.index)
        if self._comes_back():  # no beat until taken back: the survivors must see the lost island's beat stop
            self._taken_back()
            self._beat = Heartbeat(self.run.island.store, self.index, timeout).start()
            return
        self._beat = Heartbeat(self.run.island.store, self.index, timeout).start()
        for g in self.groups:
            names = self._names(g.slots)
            links = self._links(cluster, g) if cluster is not None else ()
            group = OuterGroup.join(self._store, g.key, self.index, len(self.plan.islands), timeout, links)
            sig = ";".join(f"{n}:{tuple(self.params[n].shape)}" for n in names)
            group.check_same(sig, names)
            group.warm_up(self._widest_payload(g))
            self._outer[g.key] = group

    def _widest_payload(self, g: HolderGroup) -> int:
        """Bytes of the largest payload `g` will carry (its largest bucket of any fragment, widest format)."""
        buckets = [b for f in range(len(self.fragments)) for b in self._buckets(self._due_names(g, f))]
        return max((packed_bytes([self.params[n] for n in b], fmt) for b in buckets for fmt in self.formats),
                   default=0)

    def _emulated_cluster(self, ex: "StageExecutor") -> Any:
        """Emulating in-process: the cluster file whose links stand for the WAN between the islands. Else None."""
        if self.run.emulation.mode != "inprocess":
            return None
        from hetauto.core.plan_check import cluster_for_plan

        return cluster_for_plan(ex.plan, self.run.emulation.cluster_base)

    def _links(self, cluster: Any, g: HolderGroup) -> tuple[EmulatedLink | None, ...]:
        """Per member of `g`: the cluster file's link between this holder's cluster and that member's (None for
        this island, and for a member on the same cluster)."""
        out: list[EmulatedLink | None] = []
        for i, (isl, rank) in enumerate(zip(self.plan.islands, g.members)):
            theirs = isl.plan.stages[placement(isl.plan, rank).stage].cluster
            if i == self.index or theirs == self.me.cluster:
                out.append(None)
                continue
            spec = cluster.link(self.me.cluster, theirs)
            out.append(EmulatedLink(spec.latency_s, spec.bandwidth_Bps))
        return tuple(out)

    def _names(self, slots: Any) -> list[str]:
        wanted = set(slots)
        return sorted((n for n in self.params if _slot(n) in wanted), key=lambda n: (_slot(n), n))

    def _due_names(self, g: HolderGroup, fragment: int) -> list[str]:
        """`g`'s parameters in `fragment`. A tied head's table syncs with the embedding (slot 0's fragment), as the
        single-process reference does: both copies of the table take the same merged value at the same step."""
        slots = self.fragments[fragment]
        return [n for n in self._names(g.slots) if (0 if n == self.tied_head else _slot(n)) in slots]

    def _buckets(self, names: list[str]) -> list[list[str]]:
        """`names` in consecutive runs of at most BUCKET_BYTES of fp32 whole tensors (one tensor at least), so no
        transient holds a whole stage; the cut depends on names and shapes alone, the same in every island."""
        out: list[list[str]] = []
        size = BUCKET_BYTES
        for n in names:
            nbytes = 4 * self.params[n].numel()
            if size + nbytes > BUCKET_BYTES:
                out.append([])
                size = 0
            out[-1].append(n)
            size += nbytes
        return out

    # ------------------------------------------------------------------ the hook
    def after_step(self, step: int) -> None:
        """After inner step `step` (0-based, global numbering): send the fragments whose outer step lands
        `overlap_steps` (tau) steps later (`sending_fragments`), then land the one in flight if its step has
        come. tau = 0: both at once, the blocking sync."""
        t0 = time.perf_counter()
        cfg = self.outer_cfg
        for f in sending_fragments(step, cfg.inner_steps, cfg.fragments, cfg.overlap_steps):
            self._send(step, f)
        if self.inflight is not None and self.inflight.land_step == step:
            self._land(t0 if cfg.overlap_steps == 0 else None)

    def _send(self, step: int, fragment: int) -> None:
        """Every dp-0 rank: the fragment's pseudo-gradients now (TP shards gathered); holders post their exchange
        without waiting. One fragment is in flight at a time (OuterSync: tau < H // F). With tau = 0 each bucket
        settles before the next is sent, so a sync holds one bucket's transients at a time, as before."""
        assert self.inflight is None, "a fragment's sync is still in flight"
        fl = self.inflight = InFlight(fragment, step + self.outer_cfg.overlap_steps, [], 0, 0.0, 0.0)
        t0 = time.perf_counter()
        for g in self.groups:
            for names in self._buckets(self._due_names(g, fragment)):
                part = self._post(g, names, fl)
                if self.outer_cfg.overlap_steps == 0:
                    self._settle_part(fl, part)
        fl.send_end = time.perf_counter()
        fl.send_s = fl.send_end - t0 - fl.settle_s - fl.wait_s

    def _post(self, g: HolderGroup, names: list[str], fl: InFlight) -> InFlightPart:
        """One bucket of `g`: its pseudo-gradients (dp-0 ranks) and, on the holder, its exchange posted."""
        full = self._full_pseudo_gradients(names) if self.me.dp_index == 0 else None
        part = InFlightPart(names, None, ())
        if self.is_holder:
            assert full is not None
            part.key, part.mine = g.key, pack(full, self.formats[self.index])
            part.likes = tuple(torch.empty(t.shape, device="meta") for t in full)  # shapes for unpack
            part.exchange = self._post_exchange(part, fl)
            fl.posted = part.exchange.posted if fl.posted is None else fl.posted
            fl.sent_bytes += packed_bytes(full, self.formats[self.index]) * (len(part.members) - 1)
        fl.parts.append(part)
        return part

    def settle(self) -> None:
        """Wait for the fragment in flight (holders), merge and broadcast it inside the stage: every rank then
        holds its slices of the merged pseudo-gradients (`inflight.merged`), ready to land. Collective over the
        stage; a checkpoint taken while a sync is in flight settles it to save the merged gradients."""
        fl = self.inflight
        if fl is None or fl.merged is not None:
            return
        for part in fl.parts:
            if not part.settled:
                self._settle_part(fl, part)
        fl.merged = fl.slices

    def _settle_part(self, fl: InFlight, part: InFlightPart) -> None:
        """One bucket: the holder waits for its exchange, decodes and merges every island's payload; the stage
        broadcast; this rank's slices into `fl.slices`."""
        t0, waited, full = time.perf_counter(), 0.0, None
        if part.exchange is not None:
            landed = self._landed(part, fl)
            waited = landed.waited_s
            fl.finished = max(fl.finished, landed.finished)
            formats = [self.formats[i] for i in part.members]
            weights = member_weights(self.weights, part.members)
            decoded = [unpack(p, fmt, part.likes) for p, fmt in zip(landed.payloads, formats)]
            full = [merge([d[k] for d in decoded], weights) for k in range(len(part.likes))]
            part.exchange = None  # its payloads are merged: free them
        got = self._broadcast(part.names, full)
        fl.slices.update({self.alias[n]: _slice_like(self.params[n], m) for n, m in zip(part.names, got)})
        part.settled = True
        fl.wait_s += waited
        fl.settle_s += time.perf_counter() - t0 - waited

    # ------------------------------------------------------------------ membership (a lost island)
    def _post_exchange(self, part: InFlightPart, fl: InFlight) -> PendingExchange:
        """Post `part`'s payload in its group of the current membership (formed anew after a change), agreeing
        a new membership while the post itself finds a member lost."""
        while True:
            group = self._group(part.key)
            part.members = self.membership.members
            sizes = [packed_bytes(part.likes, self.formats[i]) for i in part.members]
            try:
                assert part.mine is not None
                return group.post_bytes(part.mine, sizes)
            except PeerLost:
                self._change_members(fl)

    def _landed(self, part: InFlightPart, fl: InFlight) -> Landed:
        """`part`'s exchange waited for; when a member was lost, the survivors agree a new membership and the
        exchange is redone among them (the merge then renormalises the token weights over them)."""
        while True:
            assert part.exchange is not None
            try:
                return part.exchange.wait()
            except PeerLost:
                self._change_members(fl)
                part.exchange = self._post_exchange(part, fl)

    def _change_members(self, fl: InFlight) -> None:
        """A member of the current membership is lost: agree the next one with the survivors (or adopt it)."""
        fl.lost_at = time.perf_counter() if fl.lost_at is None else fl.lost_at
        assert self._store is not None
        change = next_members(self._store, self.membership, self.index, self.me.rank,
                              timeout_s=self.run.training.timeout_s, store_address=self.run.island.store,
                              store_island=self.plan.islands[0].name)
        self.membership = change.membership
        fl.dropped += [i for i in change.dropped if i not in fl.dropped]

    def _group(self, key: str) -> OuterGroup:
        """The group `key` of the current membership epoch: formed anew (collectively, by its surviving members)
        the first time it is used in a new epoch."""
        group = self._outer[key]
        if group.epoch == self.membership.epoch:
            return group
        self._retired.append(group)
        group = self._outer[key] = self._form(key)
        return group

    # ------------------------------------------------------------------ taking a lost island back
    def _comes_back(self) -> bool:
        """Whether this island was lost and is back (its launcher marked it lost, or the others dropped it)."""
        addr, name = self.run.island.store, self.plan.islands[0].name
        if comes_back(self._store, addr, name, self.index, self.me.rank):
            return True
        current, _ = newest(self._store, addr, name, self.membership)
        return self.index not in current.members

    def _taken_back(self) -> None:
        """The returning island's holder: ask to join, form the new epoch's groups with the members after their
        admitting landing, and take the global parameters and outer state from the lowest member."""
        if self.stage_comm is not None or self.outer_cfg.overlap_steps or not self._plain_holders():
            raise PlanMismatch(f"island '{self.name}': taking a lost island back needs tp = 1 in every island, "
                               "one rank per stage in the returning island and overlap_steps 0; resume every "
                               "island from its newest checkpoints instead")
        assert self._store is not None
        signed_off = bool(self._store.check([f"outer/lost/i{self.index}"]))  # its launcher marked it lost
        adm = ask_to_join(self._store, self.index, timeout_s=self.run.training.timeout_s,
                          store_address=self.run.island.store, store_island=self.plan.islands[0].name)
        if signed_off:
            self._store.add(DONE_KEY, -1)  # its launcher signed this holder off with the mark
        self.membership = adm.membership
        for g in self.groups:
            self._outer[g.key] = self._form(g.key)
            self._state(g, adm)
        self.taken_back_after = adm.after_step

    def first_step(self, start: int) -> int:
        """The step this rank trains first: after the admitting landing for a returning island (its own steps
        since its checkpoint are dropped: the global model wins), else `start`."""
        if self.taken_back_after is None:
            return start
        self._take_incoming()
        return self.taken_back_after + 1

    def _plain_holders(self) -> bool:
        return all(st.tp == 1 for isl in self.plan.islands for st in isl.plan.stages)

    def _admit(self, step: int) -> None:
        """A member's holder after landing step `step`'s outer step while islands are out: take back the islands
        that asked, when their admission lands now (decided here or by another holder after an earlier landing)."""
        if self.outer_cfg.overlap_steps or not self._plain_holders():
            return
        assert self._store is not None
        adm = offer_admission(self._store, self.membership, len(self.plan.islands), step, self._next_landing(step),
                              store_address=self.run.island.store, store_island=self.plan.islands[0].name)
        if adm is None or adm.after_step != step:
            return
        self.membership = adm.membership
        for g in self.groups:  # the global order, as the returning island's holders
            self._group(g.key)
            self._state(g, adm)
        self.records[-1]["joined"] = [self.plan.islands[i].name for i in adm.joined]

    def _next_landing(self, step: int) -> int | None:
        """The next step after `step` whose outer step lands with a step left to train after it (None: the run
        ends first; an island taken back after the last step would train nothing)."""
        cfg = self.outer_cfg
        return next((s for s in range(step + 1, self.run.training.steps - 1)
                     if due_fragments(s, cfg.inner_steps, cfg.fragments)), None)

    def _state(self, g: HolderGroup, adm: Admission) -> None:
        """The group's global parameters, momentum and round count from the lowest member that stayed to every
        member (one broadcast); a returning island takes them as its parameters and outer state."""
        names = self._names(g.slots)
        theta = self.outer.global_params
        momentum = self.outer.state_dict()["momentum"]
        joining = self.index in adm.joined
        parts = [torch.tensor([float(self.outer.rounds)])]
        for n in names:
            a = self.alias[n]
            parts += [theta[a].reshape(-1), momentum[a].reshape(-1) if a in momentum else torch.zeros(theta[a].numel())]
        buf = torch.cat(parts).float()
        root = adm.membership.rank_of(min(i for i in adm.membership.members if i not in adm.joined))
        self._outer[g.key].broadcast(buf, root, "the state for a returning island")
        if joining:  # taken after a resume from its checkpoint (`first_step`), which it overrides
            self._incoming.append((names, buf))

    def _take_incoming(self) -> None:
        """A returning island: the members' global parameters, momentum and round count become its own."""
        theta = self.outer.global_params
        for names, buf in self._incoming:
            self._take_state(names, buf, theta)
        self._incoming = []

    def _take_state(self, names: list[str], buf: torch.Tensor, theta: dict[str, torch.Tensor]) -> None:
        self.outer.rounds, pos = int(buf[0].item()), 1
        with torch.no_grad():
            for n in names:
                a, k = self.alias[n], theta[self.alias[n]].numel()
                theta[a].copy_(buf[pos:pos + k].reshape(theta[a].shape))
                _local(self.params[n]).copy_(theta[a].to(self.params[n].dtype))
                if self.outer_cfg.optimizer.momentum > 0:
                    self.outer.load_momentum(a, buf[pos + k:pos + 2 * k].reshape(theta[a].shape))
                pos += 2 * k

    def _form(self, key: str) -> OuterGroup:
        members = self.membership.members
        links = self._links(self._cluster, self.by_key[key]) if self._cluster is not None else ()
        links = tuple(links[i] for i in members) if links else ()
        return OuterGroup.join(self._store, key, self.membership.rank_of(self.index), len(members),
                               self.run.training.timeout_s, links, self.membership.epoch)

    def _land(self, blocking_since: float | None) -> None:
        """The outer step of the fragment in flight on this rank's slices, and the holder's record of it: sync_s
        the whole sync, exposed_s the part training stood still for (with tau = 0 both the wall time since
        `blocking_since`)."""
        self.settle()
        fl = self.inflight
        assert fl is not None and fl.merged is not None
        t0 = time.perf_counter()
        self.outer.step(fl.merged, self.outer_cfg.update_alpha)
        self.inflight = None
        end = time.perf_counter()
        if not self.is_holder:
            return
        if blocking_since is not None:
            sync_s = exposed_s = end - blocking_since
        else:
            own = fl.send_s + fl.settle_s + (end - t0)  # the rank's own work for the sync: never hidden
            sync_s, exposed_s = own + max(fl.wait_s, fl.finished - fl.send_end), own + fl.wait_s
        members = fl.parts[-1].members if fl.parts else self.membership.members
        peers = [self.plan.islands[i].name for i in members if i != self.index]
        row = {"step": fl.land_step, "fragment": fl.fragment, "bytes": fl.sent_bytes, "sync_s": sync_s,
               "exposed_s": exposed_s, "peers": peers, "phases": fl.phases(end - t0)}
        if fl.dropped:  # this sync lost an island: who, the epoch it went on in, and how long that took
            assert fl.lost_at is not None
            row.update({"dropped": [self.plan.islands[i].name for i in fl.dropped],
                        "epoch": self.membership.epoch, "recovery_s": end - fl.lost_at})
        self.records.append(row)
        if len(self.membership.members) < len(self.plan.islands):
            self._admit(fl.land_step)

    def adopt_pending(self, fragment: int, land_step: int, merged: dict[str, torch.Tensor]) -> None:
        """A resumed run: the fragment whose merged pseudo-gradients (this rank's slices, by the names the outer
        optimizer steps) a checkpoint saved while its sync was in flight; it lands after `land_step`."""
        self.inflight = InFlight(fragment, land_step, [], 0, 0.0, time.perf_counter(), merged=dict(merged))
        self.inflight.slices = self.inflight.merged

    def _full_pseudo_gradients(self, names: list[str]) -> list[torch.Tensor]:
        """θ - local of `names`, whole tensors on the host (TP shards all-gathered over the stage's TP ranks)."""
        local = self.outer.pseudo_gradient(sorted({self.alias[n] for n in names}))
        return [_full(self.params[n], local[self.alias[n]]).cpu() for n in names]

    def _broadcast(self, names: list[str], merged: list[torch.Tensor] | None) -> list[torch.Tensor]:
        """The holder's merged full tensors to every rank of the stage, as one flat fp32 buffer."""
        if self.stage_comm is None:
            assert merged is not None
            return merged
        shapes = [tuple(self.params[n].shape) for n in names]
        if merged is not None:
            flat = torch.cat([m.reshape(-1) for m in merged])
        else:
            flat = torch.zeros(sum(math.prod(s) for s in shapes), dtype=torch.float32)
        self.stage_comm.broadcast(flat, root=self.stage_comm.group_rank_of(self.holder))
        out, pos = [], 0
        for s in shapes:
            out.append(flat[pos:pos + math.prod(s)].reshape(s))
            pos += math.prod(s)
        return out

    def close(self) -> None:
        """Holders finish an exchange still in flight when training ended (it never lands: the run's parameters
        are its last step's; the last checkpoint holds it if one was taken) and sign off in the outer store;
        island 0's rank 0, which serves it, waits for every holder so that no island loses the store while it
        still needs it."""
        if self.inflight is not None and self.inflight.merged is None:
            for part in self.inflight.parts:
                if part.exchange is not None:
                    try:
                        part.exchange.wait()
                    except PeerLost:
                        pass  # it never lands anyway
        if self._store is None:
            return
        self._store.add(DONE_KEY, 1)
        if self._beat is not None:
            self._beat.stop()
        if self.index == 0 and self.me.rank == 0:
            self._wait_sign_offs()

    def _wait_sign_offs(self) -> None:
        """Island 0's rank 0 serves the store until every holder signed off (a lost island's launcher signs its
        holders off), at most `--timeout`, and no longer than every island's beat has stood still (a lost island
        across sites, which no launcher here signs off, costs the bound, not the timeout)."""
        assert self._store is not None
        timeout = self.run.training.timeout_s
        total = sum(len({g.members[i] for g in holder_groups(self.plan)}) for i in range(len(self.plan.islands)))
        deadline = time.monotonic() + timeout
        beats = BeatWatch(store_reader(self._store), timeout)
        while self._store.add(DONE_KEY, 0) < total and time.monotonic() < deadline:
            if all([beats.gone(i) for i in range(len(self.plan.islands))]):
                return
            time.sleep(0.01)


def _local(p: torch.Tensor) -> torch.Tensor:
    """The tensor this rank steps in place: the local shard of a DTensor parameter, else the parameter's data."""
    data = p.data
    return data.to_local() if hasattr(data, "to_local") else data


def _full(p: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """`local` (a slice shaped like `p`'s local shard) as the whole tensor: all-gathered over `p`'s TP mesh."""
    if not hasattr(p, "device_mesh"):
        return local
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(local, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                              stride=p.stride()).full_tensor()


def _slice_like(p: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """This rank's slice of the whole tensor `full` as `p` holds it (no communication: every rank has `full`)."""
    full = full.to(_local(p).device)
    if not hasattr(p, "device_mesh"):
        return full
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()


def _check_supported(plan: IslandPlan, index: int, ex: Any, run: RunConfig) -> None:
    """Refuse at start, in one line naming the island, what the outer sync does not support."""
    if not 0 <= index < len(plan.islands):
        raise PlanMismatch(f"island.index {index}: the island plan {run.island.plan} has {len(plan.islands)} islands "
                           f"(0..{len(plan.islands) - 1})")
    name = plan.islands[index].name
    mine = plan.islands[index].plan
    if (mine.stages, mine.global_batch, mine.schedule) != (ex.plan.stages, ex.plan.global_batch, ex.plan.schedule):
        raise PlanMismatch(f"island '{name}': the run's plan is not island {index}'s plan in {run.island.plan}; run "
                           "each island with its own plan from the island plan")
    if ex.fsdp:
        raise PlanMismatch(f"island '{name}': dp_sharding {ex.plan.dp_level} shards the parameters over DP, which the "
                           "outer sync does not support yet; use zero1 or plain data parallelism")
    odd = [n for n, p in ex.stage.named_parameters() if p.dtype != torch.float32]
    if odd:
        raise PlanMismatch(f"island '{name}': parameter {odd[0]} is {ex.stage.get_parameter(odd[0]).dtype}; the outer "
                           "sync needs fp32 master weights")
