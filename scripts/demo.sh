#!/usr/bin/env bash
# The main job on a fresh machine: install, plan the embedded default scenario, then a short real run.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet torch==2.13.0 -e .
hetauto backends
