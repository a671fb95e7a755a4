#!/usr/bin/env bash
# Installs hetauto (CPU torch pinned: torch==2.13.0 is a local wheel, a plain `torch` would pull CUDA),
# the dev tools and the template backend plugin (so entry-point discovery runs for real), then the tests.
# Services: the `slurm` tests start the two-node local Slurm they need themselves (tests/conftest.py local_slurm
# runs scripts/slurm-local.sh when no Slurm answers: as root, installing slurm-wlm and munge with apt-get if
# missing); elsewhere they fail saying so (HETAUTO_NO_SLURM=1 skips them on purpose).
set -euo pipefail
# Python: the active virtualenv, else ./.venv, else python3 if pip may install into it, else a new ./.venv
# (scripts/_python.sh).
cd "$(dirname "$0")/.."
source scripts/_python.sh
"$PY" -m pip install --quiet torch==2.13.0 -e '.[dev]' -e plugins/hetauto-backend-template
hetauto_activation_hint   # before the tests, so pytest's summary stays the last line
# One worker more than cores (at most 4), each file on one worker (its module fixtures built once): many tests
# wait on the processes they start (a training run, a timeout, a shaped link), and a spare worker keeps the cores
# busy meanwhile. HETAUTO_TEST_WORKERS=N sets the count; 0 runs in-process. Files go longest first (tests/conftest.py
# orders them by tests/file_seconds.json; --no-loadscope-reorder keeps that order), a worker's next file only when
# its current one is down to its last test (hetauto.testing.suite_schedule).
# Bytecode caches on, whatever the caller's PYTHONDONTWRITEBYTECODE: the suite starts some 400 Python processes
# (ranks, torchrun agents, commands), and without .pyc files each recompiles the hetauto modules it imports and
# every pytest worker rewrites every test module again (~0.5 s a process; the caches go to __pycache__, ignored).
unset PYTHONDONTWRITEBYTECODE
# Ranks: each pytest process starts a rank zygote (tests/conftest.py, hetauto.testing.rank_zygote) that has imported
# torch once, and the ranks of the tests' `hetauto run` jobs fork from it instead of paying ~3 CPU-s of imports each;
# so do torchrun's agents and the `hetauto` commands the tests start (`python -m hetauto ...`: ~1-3 CPU-s each).
# HETAUTO_RANK_ZYGOTE=off starts every rank and command as a user's run does (torchrun -> python -m
# hetauto.runtime.worker); HETAUTO_CLI_ZYGOTE=off keeps only the commands in processes of their own.
cores="$(nproc 2>/dev/null || echo 2)"
workers="${HETAUTO_TEST_WORKERS:-$(( cores + 1 < 4 ? cores + 1 : 4 ))}"
if [[ "$workers" == 0 ]]; then
    "$PY" -m pytest -q --durations=30 "$@"
else
    "$PY" -m pytest -q -n "$workers" --dist loadfile --no-loadscope-reorder --durations=30 "$@"
fi
