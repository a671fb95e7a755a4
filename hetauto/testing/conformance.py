"""The backend conformance suite: behavioural checks any backend (built-in or plugin) must pass.

Two ways to run it:
  failures = run_conformance(MyBackend())           # [] when the backend honours the contract
  class TestMine(BackendConformance):                # in a pytest file: one test per check
      def make_backend(self): return MyBackend()

`tensors=False` is for backends exercised through a faked vendor module (no real memory to allocate):
the random-number check then verifies the seed reached the device module instead of comparing tensors.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hetauto.core.backend import PROFILE_KEY_RE, Availability, Backend, Capabilities, MemoryStats, Timer


class ConformanceFailure(AssertionError):
    pass


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ConformanceFailure(message)


def _expect_index_error(fn: Callable[[], object], what: str) -> None:
    try:
        fn()
    except IndexError:
        return
    except Exception as err:
        raise ConformanceFailure(f"{what} raised {type(err).__name__}: {err}; expected an IndexError") from None
    raise ConformanceFailure(f"{what} did not raise; expected an IndexError")


def _available(backend: Backend) -> Availability:
    avail = backend.probe()
    _require(avail.ok, f"backend '{backend.name}' is unavailable here ({avail.reason}); conformance needs a usable device")
    return avail


# -- checks ------------------------------------------------------------------------------------------
def check_probe(backend: Backend, tensors: bool) -> None:
    """probe() never raises, returns an Availability, is repeatable, and a 'no' carries a one-line reason."""
    first, second = backend.probe(), backend.probe()
    _require(isinstance(first, Availability), f"probe() returned {type(first).__name__}, not Availability")
    _require(isinstance(first.ok, bool), "Availability.ok is not a bool")
    _require(first == second, f"probe() is not repeatable: {first} then {second}")
    if not first.ok:
        _require(bool(first.reason.strip()) and "\n" not in first.reason, "an unavailable backend needs a one-line reason")


def check_metadata(backend: Backend, tensors: bool) -> None:
    """Names, priority, hints and env variables have the documented types."""
    _require(isinstance(backend.name, str) and backend.name == backend.name.strip().lower() and backend.name != "",
             f"name {backend.name!r} must be a non-empty lowercase string")
    _require(isinstance(backend.device_type, str) and backend.device_type != "", "device_type must be a non-empty str")
    torch.device(backend.device_type)  # a device type torch knows (raises RuntimeError otherwise)
    _require(isinstance(backend.priority, int), "priority must be an int")
    _require(backend.install_hint is None or isinstance(backend.install_hint, str), "install_hint must be str or None")
    envs = backend.visible_devices_env
    ok = isinstance(envs, str) or (isinstance(envs, tuple) and all(isinstance(e, str) for e in envs))
    _require(ok, f"visible_devices_env must be a str or a tuple of str, got {envs!r}")
    _require(all(e and e == e.upper() for e in backend.visible_devices_envs), "visible-devices env names must be UPPER_CASE")


def check_dist_backend(backend: Backend, tensors: bool) -> None:
    """dist_backend is a collective name torch.distributed knows (built in or registered by the vendor)."""
    import torch.distributed as dist

    name = backend.dist_backend
    _require(isinstance(name, str) and name != "", f"dist_backend must be a non-empty str, got {name!r}")
    known = {str(b).lower() for b in dist.Backend.backend_list}
    known |= {str(v).lower() for v in dist.Backend.default_device_backend_map.values()}
    for part in name.split(","):
        coll = part.split(":", 1)[-1].strip().lower()
        _require(coll in known, f"dist_backend {name!r}: {coll!r} is not registered with torch.distributed (known: {sorted(known)})")
    composite = backend.composite_dist_backend
    _require(isinstance(composite, str) and name in composite, f"composite_dist_backend {composite!r} must contain {name!r}")


def check_device_indices(backend: Backend, tensors: bool) -> None:
    """device(i) is a torch.device of the backend's type for every i < count; out of range raises IndexError."""
    _available(backend)
    count = backend.device_count()
    _require(isinstance(count, int) and count >= 1, f"an available backend needs device_count() >= 1, got {count!r}")
    for i in range(count):
        dev = backend.device(i)
        _require(isinstance(dev, torch.device), f"device({i}) returned {type(dev).__name__}, not torch.device")
        _require(dev.type == backend.device_type, f"device({i}).type is {dev.type!r}, expected {backend.device_type!r}")
    _expect_index_error(lambda: backend.device(count), f"device({count}) with {count} devices")
    _expect_index_error(lambda: backend.device(-1), "device(-1)")


def check_set_device_and_synchronize(backend: Backend, tensors: bool) -> None:
    """set_device accepts every valid index and rejects others; synchronize works with and without an index."""
    _available(backend)
    count = backend.device_count()
    for i in range(count):
        backend.set_device(i)
        backend.synchronize(i)
    backend.set_device(0)
    _require(backend.synchronize() is None, "synchronize() must return None")
    _expect_index_error(lambda: backend.set_device(count), f"set_device({count})")
    if tensors:
        x = torch.ones(256, device=backend.device(0))
        y = (x * 2).sum()
        backend.synchronize()
        _require(float(y.item()) == 512.0, f"a simple reduction on device(0) gave {float(y.item())}, expected 512.0")


def check_seeding(backend: Backend, tensors: bool) -> None:
    """manual_seed(s) makes the random stream repeat bit-exactly; a different seed changes it."""
    _available(backend)
    dev = backend.device(0) if tensors else torch.device("cpu")

    def draw(seed: int) -> torch.Tensor:
        backend.manual_seed(seed)
        return torch.randn(64, device=dev).cpu()

    a, b, c = draw(1234), draw(1234), draw(1235)
    _require(torch.equal(a, b), "the same seed gave different random tensors")
    _require(not torch.equal(a, c), "different seeds gave the same random tensor")
    if not tensors:
        module = getattr(backend, "module", None)
        if module is not None and callable(getattr(module, "initial_seed", None)):
            backend.manual_seed(4321)
            got = module.initial_seed()
            _require(got == 4321, f"manual_seed(4321) left the device generator at seed {got}")


def check_timer(backend: Backend, tensors: bool) -> None:
    """The timer measures a 50 ms wait as >= 45 ms, an empty interval as >= 0, and the longer one as longer."""
    _available(backend)
    timer = backend.timer()
    _require(isinstance(timer, Timer), f"timer() returned {type(timer).__name__}, not hetauto Timer")
    with timer:
        pass
    short = timer.elapsed_s()
    long_timer = backend.timer()
    long_timer.start()
    time.sleep(0.05)
    long_timer.stop()
    long = long_timer.elapsed_s()
    _require(isinstance(short, float) and isinstance(long, float), "elapsed_s() must return a float")
    _require(short >= 0.0, f"an empty interval measured {short} s (< 0)")
    _require(long >= 0.045, f"a 50 ms wait measured {long * 1e3:.2f} ms")
    _require(long > short, f"a 50 ms wait ({long} s) did not measure longer than an empty interval ({short} s)")


def check_memory_stats(backend: Backend, tensors: bool) -> None:
    """memory_stats(i) is a frozen MemoryStats of non-negative ints with allocated, reserved, peak <= total."""
    _available(backend)
    count = backend.device_count()
    for i in range(count):
        if tensors:
            keep = torch.empty(1 << 20, dtype=torch.uint8, device=backend.device(i))
        stats = backend.memory_stats(i)
        _require(isinstance(stats, MemoryStats), f"memory_stats({i}) returned {type(stats).__name__}")
        for field in ("allocated", "reserved", "total", "peak"):
            value = getattr(stats, field)
            _require(isinstance(value, int) and value >= 0, f"memory_stats({i}).{field} = {value!r} is not a non-negative int")
        _require(stats.total > 0, f"memory_stats({i}).total is 0: the planner needs the capacity")
        _require(stats.allocated <= stats.total, f"memory_stats({i}): allocated {stats.allocated} > total {stats.total}")
        _require(stats.reserved <= stats.total, f"memory_stats({i}): reserved {stats.reserved} > total {stats.total}")
        _require(stats.peak <= stats.total, f"memory_stats({i}): peak {stats.peak} > total {stats.total}")
        _require(stats.allocated <= stats.peak or stats.peak == 0, f"memory_stats({i}): allocated {stats.allocated} > peak {stats.peak}")
        if tensors:
            del keep
    _expect_index_error(lambda: backend.memory_stats(count), f"memory_stats({count})")
    backend.empty_cache()


def check_capabilities(backend: Backend, tensors: bool) -> None:
    """capabilities() is a frozen Capabilities value with bool flags."""
    _available(backend)
    caps = backend.capabilities(0)
    _require(isinstance(caps, Capabilities), f"capabilities() returned {type(caps).__name__}")
    for field in ("bf16", "fp16", "fp8", "tf32"):
        _require(isinstance(getattr(caps, field), bool), f"capabilities().{field} is not a bool")
    try:
        caps.bf16 = not caps.bf16  # type: ignore[misc]
    except (dataclasses.FrozenInstanceError, AttributeError):
        pass
    else:
        raise ConformanceFailure("Capabilities must be frozen")


def check_planning_hints(backend: Backend, tensors: bool) -> None:
    """default_profile() is None or a lowercase catalog key; speed_factor(i) > 0 for every device."""
    _available(backend)
    key = backend.default_profile()
    _require(key is None or (isinstance(key, str) and bool(PROFILE_KEY_RE.match(key))),
             f"default_profile() = {key!r} is not a lowercase catalog key")
    count = backend.device_count()
    for i in range(count):
        f = backend.speed_factor(i)
        _require(isinstance(f, float) and f > 0, f"speed_factor({i}) = {f!r} must be a float > 0")
    _expect_index_error(lambda: backend.speed_factor(count), f"speed_factor({count})")


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    run: Callable[[Backend, bool], None]


CHECKS: tuple[Check, ...] = tuple(
    Check(fn.__name__.removeprefix("check_"), fn)
    for fn in (
        check_probe, check_metadata, check_dist_backend, check_device_indices, check_set_device_and_synchronize,
        check_seeding, check_timer, check_memory_stats, check_capabilities, check_planning_hints,
    )
)


@dataclass(frozen=True, slots=True)
class Failure:
    check: str
    message: str

    def __str__(self) -> str:
        return f"{self.check}: {self.message}"


def run_conformance(backend: Backend, *, tensors: bool = True) -> list[Failure]:
    """Run every check; return the failures (empty when the backend conforms). Never raises."""
    failures: list[Failure] = []
    for check in CHECKS:
        try:
            check.run(backend, tensors)
        except Exception as err:
            text = " ".join(str(err).split()) or type(err).__name__
            if not isinstance(err, ConformanceFailure):
                text = f"raised {type(err).__name__}: {text}"
            failures.append(Failure(check.name, text))
    return failures


class BackendConformance:
    """Subclass in a pytest file and implement `make_backend()`; each check becomes `test_<check>`.
    Set `tensors = False` when the device module is faked."""

    tensors: bool = True

    def make_backend(self) -> Backend:
        raise NotImplementedError("implement make_backend() to return the backend under test")


def _make_test(check: Check) -> Callable[[BackendConformance], None]:
    def test(self: BackendConformance) -> None:
        check.run(self.make_backend(), self.tensors)

    test.__name__ = f"test_{check.name}"
    test.__doc__ = check.run.__doc__
    return test


for _check in CHECKS:
    setattr(BackendConformance, f"test_{_check.name}", _make_test(_check))
del _check
