"""The live profiler behind `hetauto profile`: measures one backend's device (GEMM sweep, memory
bandwidth, per-block samples) and, across torchrun ranks, collective alpha-beta fits.

    from hetauto.backends import select_backend
    from hetauto.profiling import ProfileOptions, run_profile
    run = run_profile(select_backend(), ProfileOptions(quick=True))
    run.profile            # a DeviceProfile (hetauto.core.profile), merged over the catalog entry

Submodules are imported lazily (they import torch); `fitting` is pure Python.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ProfileOptions", "ProfileRun", "GemmFit", "run_profile", "build_profile", "efficiency_from_gemm",
           "fit_alpha_beta", "fit_saturation"]


def __getattr__(name: str) -> Any:
    if name in ("fit_alpha_beta", "fit_saturation"):
        from hetauto.profiling import fitting

        return getattr(fitting, name)
    if name in __all__:
        from hetauto.profiling import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'hetauto.profiling' has no attribute {name!r}")
