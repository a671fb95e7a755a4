"""hetauto: plan and run one training job across clusters of different accelerators.

The library in three calls (the same code as `hetauto plan`, `hetauto evaluate` and `hetauto run`)::

    import hetauto

    result = hetauto.plan("cpu-demo")                  # search: a PlanResult (.plan, .evaluation, ...)
    result.plan.save("plan.json")
    ev = hetauto.evaluate("plan.json")                 # cost model + simulator: iteration_time_s, mfu, ...
    report = hetauto.run("plan.json", steps=1, emulate=True)   # torchrun on this host: loss vs reference

The value types are here too: `Plan`, `ClusterSpec` (`load_cluster`), `ModelConfig` (`get_model`,
`known_models`), `Scenario` (`get_scenario`, `scenario_names`), `DeviceProfile` (`get_device`),
`PlanResult`, `Evaluation`, and the errors (`HetautoError`, `SpecError`, `InfeasiblePlan`).

Every name is imported on first use: `import hetauto` imports nothing else (no torch, no planner), and a
module below the top (core, backends, planner, runtime) never imports this package's API.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> the module that defines it (imported on first access, by name: no static import, so the
# layering contracts in pyproject.toml see no edge from this package to the layers; not even under
# TYPE_CHECKING: import-linter counts those, and hetauto.runtime imports this package for __version__).
_EXPORTS: dict[str, str] = {
    "plan": "hetauto.api",
    "evaluate": "hetauto.api",
    "run": "hetauto.api",
    "Plan": "hetauto.core.plan",
    "StagePlan": "hetauto.core.plan",
    "ClusterSpec": "hetauto.core.cluster",
    "load_cluster": "hetauto.core.cluster",
    "ModelConfig": "hetauto.core.model",
    "get_model": "hetauto.core.model_catalog",
    "known_models": "hetauto.core.model_catalog",
    "Scenario": "hetauto.core.scenarios",
    "get_scenario": "hetauto.core.scenarios",
    "scenario_names": "hetauto.core.scenarios",
    "DeviceProfile": "hetauto.core.profile",
    "get_device": "hetauto.core.profile",
    "PlanningInputs": "hetauto.planner.inputs",
    "load_planning_inputs": "hetauto.planner.inputs",
    "PlanResult": "hetauto.planner.search",
    "Evaluation": "hetauto.planner.evaluate",
    "HetautoError": "hetauto.core.errors",
    "SpecError": "hetauto.core.errors",
    "InfeasiblePlan": "hetauto.core.errors",
}

__all__ = ["__version__", *_EXPORTS]

def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hetauto' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
