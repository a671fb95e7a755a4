"""The backend registry and the pluggy plugin manager that fills it.

Order of loading: the built-in backends, each registered as a pluggy plugin (as pytest registers its
own), then every entry point of the `hetauto.backends` group. A plugin that fails to import, to pass
pluggy's validation or to register is recorded as a `PluginError` and skipped; loading never fails.
Environment:
  HETAUTO_DISABLE_PLUGIN_AUTOLOAD=1   load no entry points (built-ins only)
  HETAUTO_PLUGINS=dist:a,b            load only these plugins (`dist-name:entry-point`; a plain entry-point name
                                      only while one distribution offers it); the others are recorded as
                                      skipped; set but empty: no plugins
  HETAUTO_BACKEND=name                `select()` uses this backend or fails loudly
The first two are the plugin policy every plugin group shares (hetauto.core.plugin_policy; launch targets too).
"""

from __future__ import annotations

import importlib.metadata as md
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pluggy

from hetauto.backends import hookspecs
from hetauto.core.backend import Backend
from hetauto.core.errors import BackendUnavailable, HetautoError, UnknownBackend
from hetauto.core.plugin_policy import admit, autoload_enabled
from hetauto.core.transport import TransportSpec

ENTRY_POINT_GROUP = "hetauto.backends"
BUILTIN_MODULES = (
    "hetauto.backends.npu",
    "hetauto.backends.cuda",
    "hetauto.backends.rocm",
    "hetauto.backends.xpu",
    "hetauto.backends.cpu",
    "hetauto.backends.mock",
    "hetauto.backends.transports",
)
BUILTIN_SOURCE = "builtin"


@dataclass(frozen=True, slots=True)
class PluginError:
    """A plugin that could not be loaded: entry-point name, distribution ("dist==version") and the error."""

    name: str
    dist: str
    error: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "dist": self.dist, "error": self.error}


@dataclass(frozen=True, slots=True)
class SkippedPlugin:
    name: str
    dist: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "dist": self.dist, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class BackendInfo:
    """One row of `hetauto backends`."""

    name: str
    source: str
    available: bool
    reason: str
    device_count: int
    dist_backend: str
    install_hint: str | None = None
    priority: int = 0

    def to_dict(self) -> dict[str, Any]:
        reason = self.reason
        if not self.available and self.install_hint:
            reason = f"{reason}; install: {self.install_hint}"
        return {
            "name": self.name, "source": self.source, "available": self.available, "reason": reason,
            "device_count": self.device_count, "dist_backend": self.dist_backend,
        }


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


class BackendRegistry:
    """Backends by name, with where each came from. Plugins call `add()` from their hook."""

    def __init__(self) -> None:
        self._backends: dict[str, Backend] = {}
        self._sources: dict[str, str] = {}
        self._current_source = BUILTIN_SOURCE
        self._current_plugin = "?"
        self.errors: list[PluginError] = []
        self.skipped: list[SkippedPlugin] = []
        self._transports: list[tuple[TransportSpec, str]] = []

    # -- called by plugins ------------------------------------------------------------------
    def add(self, backend: Backend) -> None:
        if not isinstance(backend, Backend):
            raise TypeError(f"registry.add() needs a hetauto Backend instance, got {type(backend).__name__}")
        name = backend.name
        if name in self._backends:
            raise ValueError(f"backend '{name}' is already registered by {self._sources[name]}")
        self._backends[name] = backend
        self._sources[name] = self._current_source

    def add_transport(self, spec: TransportSpec) -> None:
        if not isinstance(spec, TransportSpec):
            raise TypeError(f"registry.add_transport() needs a hetauto TransportSpec, got {type(spec).__name__}")
        for other, source in self._transports:
            if other.name == spec.name:
                raise ValueError(f"transport '{spec.name}' is already registered by {source}")
        self._transports.append((spec, self._current_source))

    def transports(self) -> list[TransportSpec]:
        """By priority, highest first; ties by name."""
        return [t for t, _ in sorted(self._transports, key=lambda ts: (-ts[0].priority, ts[0].name))]

    def transport_source(self, name: str) -> str:
        for spec, source in self._transports:
            if spec.name == name:
                return source
        raise KeyError(name)

    def transport_for(self, src: Backend, dst: Backend) -> TransportSpec:
        """The highest-priority transport that carries tensors between stages on `src` and `dst`."""
        for spec in self.transports():
            try:
                if spec.supports(src, dst):
                    return spec
            except Exception:  # noqa: BLE001 - a plugin's faulty check means "does not support"
                continue
        raise HetautoError(f"no transport connects backend '{src.name}' to '{dst.name}' "
                           f"(registered: {', '.join(t.name for t in self.transports()) or 'none'})")

    # -- lookups ----------------------------------------------------------------------------
    def __contains__(self, name: object) -> bool:
        return name in self._backends

    def __iter__(self) -> Iterator[Backend]:
        return iter(self.ordered())

    def names(self) -> list[str]:
        return [b.name for b in self.ordered()]

    def ordered(self) -> list[Backend]:
        """By priority, highest first (npu > cuda/rocm > xpu > cpu > mock); ties by name."""
        return sorted(self._backends.values(), key=lambda b: (-b.priority, b.name))

    def source(self, name: str) -> str:
        return self._sources[self.get(name).name]

    def get(self, name: str) -> Backend:
        try:
            return self._backends[name]
        except KeyError:
            raise UnknownBackend(name, list(self._backends)) from None

    def select(self, name: str | None = None) -> Backend:
        """The backend to run on: `name`, else $HETAUTO_BACKEND, else the highest-priority available one.
        A named backend that cannot run raises `BackendUnavailable` with its reason and install hint."""
        name = name or os.environ.get("HETAUTO_BACKEND", "").strip() or None
        if name is not None:
            backend = self.get(name)
            avail = backend.probe()
            if not avail.ok:
                raise BackendUnavailable(name, avail.reason, backend.install_hint)
            return backend
        for backend in self.ordered():
            if backend.auto_select and backend.probe().ok:
                return backend
        raise HetautoError("no backend is available (not even 'cpu'); run `hetauto backends` to see why")

    def info(self, name: str) -> BackendInfo:
        backend = self.get(name)
        avail = backend.probe()
        count = 0
        if avail.ok:
            try:
                count = int(backend.device_count())
            except Exception as err:
                avail = type(avail).no(f"device_count() failed: {_one_line(err)}")
        try:
            dist = backend.dist_backend
        except Exception as err:
            dist = f"? ({_one_line(err)})"
        return BackendInfo(
            name=backend.name, source=self._sources[backend.name], available=avail.ok, reason=avail.reason,
            device_count=count, dist_backend=dist, install_hint=backend.install_hint, priority=backend.priority,
        )

    def infos(self) -> list[BackendInfo]:
        return [self.info(b.name) for b in self.ordered()]


class PluginLoader:
    """Registers plugins one by one with pluggy and calls each one's hook in isolation, so a faulty
    plugin is attributed and skipped instead of taking the others down."""

    def __init__(self, registry: BackendRegistry) -> None:
        self.registry = registry
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs.BackendHookSpecs)

    def load(self, plugin: object, name: str, source: str) -> bool:
        reg = self.registry
        try:
            self.pm.register(plugin, name=name)
        except Exception as err:  # pluggy validation (bad hook signature), duplicate name ...
            reg.errors.append(PluginError(name, source, _one_line(err)))
            return False
        others = [p for p in self.pm.get_plugins() if p is not plugin]
        hook = self.pm.subset_hook_caller("hetauto_register_backends", remove_plugins=others)
        transports = self.pm.subset_hook_caller("hetauto_transports", remove_plugins=others)
        before = dict(reg._backends)
        before_transports = list(reg._transports)
        reg._current_source, reg._current_plugin = source, name
        try:
            hook(registry=reg)
            transports(registry=reg)
        except Exception as err:
            # Roll back whatever this plugin half-registered.
            for added in set(reg._backends) - set(before):
                del reg._backends[added]
                del reg._sources[added]
            reg._transports = before_transports
            self.pm.unregister(plugin)
            reg.errors.append(PluginError(name, source, _one_line(err)))
            return False
        finally:
            reg._current_source, reg._current_plugin = BUILTIN_SOURCE, "?"
        return True

    def load_builtins(self, modules: Iterable[str] = BUILTIN_MODULES) -> None:
        import importlib

        for modname in modules:
            short = modname.rsplit(".", 1)[-1]
            try:
                module = importlib.import_module(modname)
            except Exception as err:
                self.registry.errors.append(PluginError(short, BUILTIN_SOURCE, _one_line(err)))
                continue
            self.load(module, name=f"hetauto-builtin-{short}", source=BUILTIN_SOURCE)

    def load_entry_points(self, entry_points: Iterable[md.EntryPoint] | None = None) -> None:
        """Every entry point the plugin policy admits (hetauto.core.plugin_policy: HETAUTO_PLUGINS); the others are
        recorded as skipped."""
        reg = self.registry
        if entry_points is None:
            entry_points = md.entry_points(group=ENTRY_POINT_GROUP)
        load, skipped = admit(entry_points)
        reg.skipped.extend(SkippedPlugin(s.name, s.source, s.reason) for s in skipped)
        for ep, source in load:
            try:
                plugin = ep.load()
            except BaseException as err:  # a plugin's import may even call sys.exit()
                if isinstance(err, KeyboardInterrupt):
                    raise
                reg.errors.append(PluginError(ep.name, source, _one_line(err)))
                continue
            self.load(plugin, name=ep.name, source=source)


def build_registry(*, autoload: bool | None = None, entry_points: Iterable[md.EntryPoint] | None = None) -> BackendRegistry:
    """A fresh registry: built-ins, then entry points unless `autoload` is False or
    HETAUTO_DISABLE_PLUGIN_AUTOLOAD=1."""
    registry = BackendRegistry()
    loader = PluginLoader(registry)
    loader.load_builtins()
    if autoload is None:
        autoload = autoload_enabled()
    if autoload:
        loader.load_entry_points(entry_points)
    return registry
