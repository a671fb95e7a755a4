#!/usr/bin/env bash
# The main job on a fresh machine: install, show the backends, validate the default scenario's inputs,
# and simulate a Virtual-1F1B pipeline over a slow boundary. (The planner and `hetauto run` join this
# script when they land: see the open issues.)
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet torch==2.13.0 -e .
hetauto backends
hetauto plan
hetauto simulate --synthetic --schedule virtual-1f1b --stages 4 --microbatches 8 --tf 1 --tb 2 --link-latency 1:3
