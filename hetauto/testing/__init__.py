"""Test helpers shipped with hetauto: the backend conformance suite and fake vendor device modules."""

from __future__ import annotations

from hetauto.testing.conformance import CHECKS, BackendConformance, ConformanceFailure, Failure, run_conformance
from hetauto.testing.fakes import FakeDeviceModule

__all__ = ["CHECKS", "BackendConformance", "ConformanceFailure", "Failure", "FakeDeviceModule", "run_conformance"]
