"""The whole hostile-input table that benchmarks/hostile_inputs.py runs and tests/project/test_hostile_inputs.py requires
clean: hetauto.testing.hostile_cases' tables, then issue 42's (hetauto.testing.hostile_cases_inputs, which builds
on the first module's helpers; joined here so neither imports the other in a cycle)."""

from __future__ import annotations

from hetauto.testing.hostile import Case
from hetauto.testing.hostile_cases import all_cases as command_cases
from hetauto.testing.hostile_cases import base
from hetauto.testing.hostile_cases_inputs import issue42_cases

__all__ = ["all_cases", "base"]


def all_cases() -> list[Case]:
    return command_cases() + issue42_cases()
