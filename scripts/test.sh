#!/usr/bin/env bash
# Installs hetauto (CPU torch pinned: torch==2.13.0 is a local wheel, a plain `torch` would pull CUDA),
# the dev tools and the template backend plugin (so entry-point discovery runs for real), then the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet torch==2.13.0 -e '.[dev]' -e plugins/hetauto-backend-template
python3 -m pytest -q --durations=10 "$@"
