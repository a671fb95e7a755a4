"""A rank's device and each boundary's transport, for vendors this machine lacks: the vendor modules' public
surface is faked (hetauto.testing.fakes, as torch_npu exposes torch.npu), so device selection, the
visible-devices variable, the dist backend and the transport choice are checked without hardware."""

from __future__ import annotations

import pytest
import torch

from hetauto.backends.hookspecs import hookimpl
from hetauto.backends.manager import PluginLoader, build_registry
from hetauto.core.backend import Backend
from hetauto.core.errors import HetautoError
from hetauto.core.precision import DeviceKind, resolve_precision
from hetauto.core.stage_backends import builtin_transport_kind
from hetauto.core.transport import BoundaryTransport, DeviceTransportSpec, HostTransportSpec, TransportSpec
from hetauto.runtime.devices import bind_device, device_index
from hetauto.testing.fakes import FakeDeviceModule, install_fake_device_module, install_fake_torch_npu


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.delenv("HETAUTO_BACKEND", raising=False)
    return build_registry(autoload=False)


@pytest.fixture
def fake_npu(monkeypatch):
    return install_fake_torch_npu(monkeypatch, FakeDeviceModule("npu", count=4, name="Ascend910B3", total_memory=64 << 30))


@pytest.fixture
def fake_cuda(monkeypatch):
    return install_fake_device_module(monkeypatch, FakeDeviceModule("cuda", count=2, name="NVIDIA H800"),
                                      cuda_version="12.4")


# -- the transport each boundary gets ------------------------------------------------------------------
@pytest.mark.parametrize("src, dst, kind", [
    ("npu", "cuda", "host"),    # two vendors: no collective library spans both
    ("cuda", "cuda", "device"),  # nccl end to end
    ("cuda", "rocm", "host"),    # RCCL also calls itself nccl but cannot talk to NCCL
    ("cpu", "mock", "host"),     # both gloo, but two backends: what the demo crosses
    ("mock", "mock", "device"),
])
def test_each_boundary_gets_the_builtin_transport_for_its_two_backends(registry, src, dst, kind) -> None:
    assert registry.transport_for(registry.get(src), registry.get(dst)).name == kind
    assert builtin_transport_kind(src, dst) == kind  # the cost model prices the same choice


def test_the_dist_backends_the_stage_groups_use(registry, fake_npu, fake_cuda) -> None:
    assert [registry.get(n).dist_backend for n in ("npu", "cuda", "cpu", "mock")] == ["hccl", "nccl", "gloo", "gloo"]


class _Bridge(TransportSpec):
    """A plugin's cross-vendor transport (say, a collective library spanning Ascend and NVIDIA)."""

    name = "bridge"
    priority = 50

    def supports(self, src: Backend, dst: Backend) -> bool:
        return {src.name, dst.name} == {"npu", "cuda"}

    def connect(self, world, src_ranks, dst_ranks, src, dst) -> BoundaryTransport:
        raise NotImplementedError


class _BridgePlugin:
    @hookimpl
    def hetauto_transports(self, registry) -> None:
        registry.add_transport(_Bridge())


class _BrokenPlugin:
    @hookimpl
    def hetauto_transports(self, registry) -> None:
        registry.add_transport(HostTransportSpec())  # "host" again: refused, and the plugin rolled back


def test_a_plugin_transport_wins_where_it_supports_the_pair_and_nowhere_else(registry) -> None:
    loader = PluginLoader(registry)
    assert loader.load(_BridgePlugin(), name="bridge-plugin", source="bridge-dist==1.0")
    npu, cuda = registry.get("npu"), registry.get("cuda")
    assert registry.transport_for(npu, cuda).name == "bridge"
    assert registry.transport_for(cuda, cuda).name == "device"
    assert [t.name for t in registry.transports()] == ["bridge", "device", "host"]
    assert registry.transport_source("bridge") == "bridge-dist==1.0"
    assert not loader.load(_BrokenPlugin(), name="broken", source="broken-dist==0.1")
    assert registry.errors[-1].error == "ValueError: transport 'host' is already registered by builtin"
    assert [t.name for t in registry.transports()] == ["bridge", "device", "host"]


class _World:
    """Stands in for the world Communicator: records the groups a transport asks for."""

    backend = "gloo"
    global_rank = 0
    links = None

    def __init__(self) -> None:
        self.groups: list[tuple[tuple[int, ...], str | None]] = []

    def new_group(self, ranks, *, backend=None, timeout_s=None):
        self.groups.append((tuple(ranks), backend))
        return self


def test_a_tagless_device_backend_gets_one_group_per_direction(registry, fake_npu) -> None:
    world = _World()
    npu = registry.get("npu")
    bt = DeviceTransportSpec().connect(world, [2, 3], [4, 5], npu, npu)
    # hccl/nccl P2P matches messages by order, not tag: each direction is its own ordered stream
    assert world.groups == [((2, 3, 4, 5), "hccl"), ((2, 3, 4, 5), "hccl")]
    assert bt.name == "device" and bt.forward is not bt.backward
    gloo_world = _World()
    cpu = registry.get("cpu")
    same = DeviceTransportSpec().connect(gloo_world, [0], [1], cpu, cpu)
    assert gloo_world.groups == [] and same.forward is same.backward  # gloo keeps tags: the world group itself
    assert same.forward.group is gloo_world


# -- the device a rank binds ------------------------------------------------------------------------------
def test_device_index_counts_the_ranks_before_it_on_its_host_with_the_same_backend() -> None:
    # host A: ranks 0-3 (stage 0 on npu x2, stage 1 on cpu, stage 2 on npu); host B: ranks 4-7, all npu
    names = ["npu", "npu", "cpu", "npu", "npu", "npu", "npu", "npu"]
    assert [device_index(names, r, r) for r in range(4)] == [0, 1, 0, 2]
    assert [device_index(names, r, r - 4) for r in range(4, 8)] == [0, 1, 2, 3]  # LOCAL_RANK on a node of one cluster


def test_a_rank_binds_its_npu_device_through_the_backend(registry, fake_npu) -> None:
    npu = registry.get("npu")
    dev = bind_device(npu, 2, where="rank 3 (stage 2, cluster 'ascend')")
    assert fake_npu.current == 2  # torch.npu.set_device(2), through the contract
    assert dev.device == torch.device("npu", 2) and dev.describe() == "npu:2"
    assert (dev.name, dev.dist_backend) == ("npu", "hccl")
    assert dev.kind == DeviceKind(host=False, bf16=True, fp16=True)
    assert resolve_precision("auto", [dev.kind]) == "bf16"  # an accelerator job defaults to bf16


def test_a_device_the_host_does_not_show_is_one_line_naming_the_visible_devices(registry, fake_npu, monkeypatch) -> None:
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "4,5,6,7")
    with pytest.raises(HetautoError) as err:
        bind_device(registry.get("npu"), 4, where="rank 9 (stage 1, cluster 'ascend')")
    assert str(err.value) == ("rank 9 (stage 1, cluster 'ascend'): needs npu device 4 but this host shows 4 "
                              "(ASCEND_RT_VISIBLE_DEVICES=4,5,6,7); run fewer ranks of this backend per host (one per "
                              "device), or make more devices visible")


def test_every_rank_of_the_cpu_backend_shares_the_host(registry) -> None:
    dev = bind_device(registry.get("cpu"), 5)
    assert (dev.index, dev.device, dev.kind.host) == (0, torch.device("cpu", 0), True)
    assert resolve_precision("auto", [DeviceKind(host=False), dev.kind]) == "fp32"  # a CPU stage: fp32


def test_an_explicit_precision_a_device_lacks_is_refused() -> None:
    with pytest.raises(ValueError, match="^precision bf16: a stage's device has no bf16; use fp16 or fp32$"):
        resolve_precision("bf16", [DeviceKind(host=False, bf16=False)])


# -- what a tag-less device transport relies on -----------------------------------------------------------
def _plan(p: int, m: int, name: str, v: int = 1):
    from hetauto.core.plan import Plan, ScheduleSpec, StagePlan

    slots = 2 + 2 * p * max(v, 2)
    cuts = [slots * i // p for i in range(p + 1)]
    stages = tuple(StagePlan(cluster="fast", device_type="cpu", devices=(0,), layers=(cuts[i], cuts[i + 1]), tp=1,
                             dp=1) for i in range(p))
    extra = (1,) * (p - 1) if name == "virtual-1f1b" else ()
    return Plan(model="tiny-gpt", cluster=None, seq_len=8, global_batch=m, microbatch_size=1, num_microbatches=m,
                stages=stages, schedule=ScheduleSpec(name=name, virtual_chunks=v, extra_warmup=extra))


@pytest.mark.parametrize("name, v", [("gpipe", 1), ("1f1b", 1), ("virtual-1f1b", 1), ("interleaved", 2),
                                     ("interleaved", 3)])
@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("mult", [1, 2, 3])
def test_both_sides_of_every_boundary_post_in_the_same_order(name: str, v: int, p: int, mult: int) -> None:
    """nccl/hccl P2P has no tags: messages between two ranks match in the order they are posted. The device
    transport gives each direction of a boundary its own group, so it is correct iff, for every stage pair and
    direction, the sender posts its sends in exactly the order the receiver posts its receives."""
    from hetauto.schedule.actions import ActionType as A
    from hetauto.schedule.for_plan import schedule_for_plan

    ranks = schedule_for_plan(_plan(p, p * mult, name, v)).ranks
    for r in range(p):
        nxt = (r + 1) % p
        if name != "interleaved" and r == p - 1:
            continue
        # activations r -> nxt, tagged by the virtual boundary (the sender's virtual stage) and the microbatch
        sent = [(a.stage, a.microbatch) for a in ranks[r] if a.type is A.SEND_F]
        posted = [(a.stage - 1, a.microbatch) for a in ranks[nxt] if a.type is A.RECV_F]
        assert sent == posted and sent, (r, sent, posted)
        # their gradients nxt -> r
        sent_b = [(a.stage - 1, a.microbatch) for a in ranks[nxt] if a.type is A.SEND_B]
        posted_b = [(a.stage, a.microbatch) for a in ranks[r] if a.type is A.RECV_B]
        assert sent_b == posted_b and sent_b, (r, sent_b, posted_b)
