"""What `hetauto launch` / `hetauto run --print-launch` refuse in `--env` and `--site-option` before a launch plan
is written: variables the node agent manages, and option values no scheduler could take.

Why refused rather than passed on: a user's `--env CUDA_VISIBLE_DEVICES=0` or `MASTER_PORT=1` would silently
override what the agent sets for each rank (the plan's devices, torchrun's rendezvous), so the job would run on
other devices or never meet; `PYTHONPATH` or `HETAUTO_BACKEND` would change which code runs on every node. A
`--site-option` value reaches an sbatch line, a YAML file or a pod's command: a newline or a shell metacharacter
there is never what a scheduler means.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["MANAGED_ENV", "VISIBLE_DEVICES_ENV", "CODE_ENV", "managed_env_reason", "site_option_problem",
           "launch_file_problem"]

_RENDEZVOUS = "torchrun sets it for each rank from the launch plan's rendezvous; change it with --master"
_RANKS = "torchrun sets it for each rank from the plan; the plan decides ranks"
_CODE = "it changes which code runs on every node"
MANAGED_ENV: dict[str, str] = {
    "MASTER_ADDR": _RENDEZVOUS, "MASTER_PORT": _RENDEZVOUS,
    "RANK": _RANKS, "WORLD_SIZE": _RANKS, "LOCAL_RANK": _RANKS, "LOCAL_WORLD_SIZE": _RANKS, "GROUP_RANK": _RANKS,
    "GROUP_WORLD_SIZE": _RANKS, "ROLE_RANK": _RANKS, "ROLE_WORLD_SIZE": _RANKS, "NODE_RANK": _RANKS,
    "TORCHELASTIC_RUN_ID": _RANKS, "OMP_NUM_THREADS": "the agent sets it from --omp-threads; use that flag",
    "PYTHONPATH": _CODE, "PYTHONHOME": _CODE, "PYTHONSTARTUP": _CODE, "LD_PRELOAD": _CODE,
    "HETAUTO_BACKEND": _CODE, "HETAUTO_PLUGINS": _CODE, "HETAUTO_DISABLE_PLUGIN_AUTOLOAD": _CODE,
    "HETAUTO_MODEL_CODE": "it allows importing model code; use --model-code MODULE",
    "HETAUTO_CONTROL": "the node agent sets it to its control store",
    "HETAUTO_CONTROL_TOKEN": "the node agent sets it from the job's secret file (a secret never goes into launch.json: "
                             "give the file with --secret-file)",
    "HETAUTO_LAUNCHER": "the node agent sets it", "HETAUTO_NODE_RANK": "the target's script sets it",
    "HETAUTO_FIRST_NODE_RANK": "the target's script sets it", "HETAUTO_INJECT_FAULT": "it is a test hook",
}
# what a launch plan's own `env` (a file another site hands over) may never set: each changes which code runs
CODE_ENV = frozenset(name for name, why in MANAGED_ENV.items() if why == _CODE) | {"HETAUTO_MODEL_CODE"}
# a file Python would import or execute from the working folder (on sys.path of the agent, torchrun and the ranks)
_IMPORTABLE = (".py", ".pyc", ".pyw", ".pth", ".so", ".pyd")

# every built-in backend's visible-devices variables (a plugin's come from the registry: managed_env_reason)
VISIBLE_DEVICES_ENV = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                       "ASCEND_RT_VISIBLE_DEVICES", "ZE_AFFINITY_MASK")


def managed_env_reason(name: str, visible_devices_env: Iterable[str] = ()) -> str | None:
    """Why `--env NAME=...` is refused (the agent manages NAME), or None when a user may set it."""
    if name in VISIBLE_DEVICES_ENV or name in set(visible_devices_env):
        return ("the node agent sets each node's visible devices from the plan (--visible-devices scheduler leaves "
                "them to the scheduler)")
    return MANAGED_ENV.get(name)


# characters a shell, a YAML line or an sbatch directive would read as more than a value
_UNSAFE = re.compile(r"[\x00-\x20\x7f`$;<>\\'\"!]")


def site_option_problem(key: str, value: str) -> str | None:
    """Why a `--site-option` value is refused whatever the target (a control character, a space, a shell
    metacharacter), or None; each target checks its own keys' syntax besides (slurm `time`, `mem`, ...)."""
    bad = _UNSAFE.search(value)
    if bad is not None:
        return (f"{key}={value!r} contains {bad.group()!r}: a site option is one word without spaces, quotes or "
                "shell metacharacters")
    return None


def launch_file_problem(name: str, plan: dict, island_plan: str | None = None) -> str | None:
    """Why a launch plan may not carry file `name` (None: it may). The files are the data the plan names (its
    cluster spec, a model's config.json: hetauto.launch.plan.portable_plan) and, for an island of an island plan,
    the island plan its run options name (`island_plan`), and nothing else: the node agent writes them into its
    working folder, which is on Python's import path, so a `json.py` there would run inside the agent, torchrun and
    every rank."""
    if name not in (plan.get("cluster"), plan.get("model")) and (island_plan is None or name != island_plan):
        return "the plan names no such file (a launch plan carries only the cluster spec and model config it names)"
    if "/" in name or "\\" in name or name.startswith("."):
        return "a file name, not a path, is expected"
    if name.lower().endswith(_IMPORTABLE) or name.split(".")[0] in ("sitecustomize", "usercustomize"):
        return "Python would import or run it from the working folder"
    return None
