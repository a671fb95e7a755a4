#!/usr/bin/env bash
# The main job on a fresh machine: install, show the backends, validate the default scenario's inputs,
# simulate a Virtual-1F1B pipeline over a slow boundary, then plan the cpu-demo scenario (a cpu cluster and a
# cluster of mock devices: its plan crosses a cpu -> mock boundary through the host transport) and train that
# plan for real (torchrun, emulated cluster speeds and links), loss next to the single-process reference; it
# ends by drawing the plan and a Gantt chart of its simulated iteration and naming both files
# (in $HETAUTO_DEMO_DIR, default /tmp).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_python.sh   # the active virtualenv, ./.venv, or python3 (creates .venv if pip is refused)
# pytest: the README's third job runs the template plugin's tests
python3 -m pip install --quiet torch==2.13.0 -e . "pytest>=8.0"
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
step "1/5 the backends this machine can run (built-in and installed plugins)"
hetauto backends
step "2/5 the best plan for the default scenario (llama2-70b over four clusters of different vendors)"
hetauto plan
step "3/5 a Virtual-1F1B pipeline whose slow link (stage 1 -> 2, 3 time units) is extra pipeline depth"
hetauto simulate --synthetic --schedule virtual-1f1b --stages 4 --microbatches 8 --tf 1 --tb 2 --link-latency 1:3
out="${HETAUTO_DEMO_DIR:-/tmp}"
step "4/5 plan the tiny cpu-demo scenario (a cpu cluster and a cluster of mock devices)"
hetauto plan --scenario cpu-demo -o "$out/hetauto-cpu-demo-plan.json" --plot "$out/hetauto-cpu-demo-plan.png"
step "5/5 train that plan for real (torchrun, emulated speeds and links), loss beside the single-process reference"
hetauto run "$out/hetauto-cpu-demo-plan.json" --steps 3 --emulate --trace "$out/hetauto-cpu-demo-trace.json"
hetauto simulate "$out/hetauto-cpu-demo-plan.json" --gantt "$out/hetauto-cpu-demo-gantt.png" > /dev/null
echo
echo "pictures of the cpu-demo run:"
echo "  the plan (clusters, stages, links, memory): $out/hetauto-cpu-demo-plan.png"
echo "  its simulated iteration (Gantt chart):      $out/hetauto-cpu-demo-gantt.png"
echo "  the measured run (Chrome trace, open in https://ui.perfetto.dev): $out/hetauto-cpu-demo-trace.json"
hetauto_activation_hint
