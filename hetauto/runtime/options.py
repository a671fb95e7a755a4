"""`RunOptions`: the name the launchers knew the run configuration by, kept for them.

The run configuration is `hetauto.core.run_config.RunConfig` (a tree of sections: training, data, checkpoint,
emulation, faults), which every layer may read; new code imports it from there.
"""

from __future__ import annotations

from hetauto.core.run_config import EMULATION_MODES, RunConfig

__all__ = ["RunOptions", "EMULATION_MODES"]

RunOptions = RunConfig
