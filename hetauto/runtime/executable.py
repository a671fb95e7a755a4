"""What the executor cannot run, checked before anything is launched (no torch import).

Why its own module: `hetauto run` rejects such a plan before starting torchrun; importing the executor
(torch, several seconds) just for this check would delay every launch. The check itself lives in
`hetauto.core.plan_check` so that the one plan validator (`validate_plan`, shared by run, simulate, evaluate
and plan --resume) can call it from the bottom layer.
"""

from __future__ import annotations

from hetauto.core.plan_check import check_executable

__all__ = ["check_executable"]
