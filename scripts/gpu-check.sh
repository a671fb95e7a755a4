#!/usr/bin/env bash
# gpu-check.sh: does hetauto train for real on an NVIDIA GPU (issue 15)? Two short runs on REAL devices
# (never --emulate), each `hetauto run PLAN --steps 5 --json`, checked against the single-process reference:
#
#   (a) one stage on cuda:0: cluster `gpu` (1 device, profile h200 if the catalog has it, else h100,
#       backend cuda), tiny-gpt, training.precision bf16;
#   (b) two stages: stage 0 on cluster `gpu` (cuda:0), stage 1 on cluster `host` (the CPU, backend cpu),
#       joined by a 10Gbps/1ms link, so the boundary must use the `host` transport (cuda -> pinned host
#       staging -> gloo -> cpu); precision auto, which must resolve to fp32 (a stage computes on the CPU).
#
# For each run it prints loss vs reference per step, measured vs predicted step time, and per stage the
# measured vs predicted peak memory, and checks:
#   - max |loss - reference| <= the run's loss_tolerance (hetauto.core.precision.PRECISION_TOLERANCE for the
#     precision the run reports) and that precision is the expected one;
#   - every rank of the gpu stage ran on cuda:0 with backend cuda, the host stage on the CPU (cpu backend);
#   - (b): boundaries[0].transport == "host";
#   - nothing was emulated;
#   - a CUDA stage's measured peak memory is > 0 and <= the planner's predicted peak (the prediction must be an
#     upper bound, or plans that "fit" would run out of memory). Host-memory stages are reported, not checked.
# Then (c), one process on cuda:0, one line: W sets offloaded on side streams (hetauto.runtime.w_offload) give the
# plain backward's gradients bit for bit, and matmuls queued beside a copy out take less than alone + half the copy.
# Exit 0: all checks passed; 1: a check failed (each failure is printed as "MISMATCH ..."); 3: no usable CUDA
# torch (or hetauto's dependencies) could be installed; other: the script itself broke.
#
# Setup (skipped when already satisfied): a CUDA torch (torch==2.13.0 from the PyTorch cu128 index, else the
# default PyPI wheel, which is a CUDA build on Linux x86-64), then hetauto (`pip install -e . --no-deps`; when
# that cannot build offline, the checkout is used through PYTHONPATH) and its pure-Python dependencies if
# missing. Each run is capped with `timeout` (GPU_CHECK_TIMEOUT, default 240 s); the whole check is meant to
# finish in under 5 minutes.
#
# Environment:
#   GPU_CHECK_DRY=1      dry run on a machine without a GPU: no installs, the gpu cluster runs on the `mock`
#                        backend (a CPU stand-in with a device index) instead of cuda, so the plan writing, the
#                        two real `hetauto run` launches and the JSON checks are exercised for real on the CPU.
#   GPU_CHECK_TIMEOUT    seconds per `hetauto run` (default 240)
#   GPU_CHECK_STEPS      training steps per run (default 5)
#   GPU_CHECK_KEEP=1     keep the temp folder with plans, clusters and outputs (printed at the end)
#   PYTHON               the interpreter (default python3)
#
#   bash scripts/gpu-check-wheels.sh          # here, once, where pip reaches PyPI: the packages a bare GPU image
#                                             # lacks (pydantic & co.) as cp312 wheels in .whl/ (git-ignored)
#   bash scripts/gpu-check.sh                 # on the GPU machine (carry .whl/ along)
#   GPU_CHECK_DRY=1 bash scripts/gpu-check.sh # anywhere: the same path on the CPU
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PY=${PYTHON:-python3}
DRY=${GPU_CHECK_DRY:-0}
RUN_TIMEOUT=${GPU_CHECK_TIMEOUT:-240}
STEPS=${GPU_CHECK_STEPS:-5}
TORCH_PIN=2.13.0
TORCH_INDEX=https://download.pytorch.org/whl/cu128
T0=$SECONDS

say() { echo "gpu-check: $*"; }
die3() { echo "gpu-check: SETUP FAILED: $*" >&2; exit 3; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/hetauto-gpu-check.XXXXXX")
cleanup() { if [ "${GPU_CHECK_KEEP:-0}" = 1 ]; then say "kept $WORK"; else rm -rf "$WORK"; fi; }
trap cleanup EXIT

# the checkout itself is importable whatever pip manages to do (the workers inherit it through torchrun)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
# quiet, bounded pip: a machine without a route to the index should fail in seconds, not minutes
PIP=("$PY" -m pip install --disable-pip-version-check --no-input --timeout 20 --retries 1)
export PIP_BREAK_SYSTEM_PACKAGES=1  # a distribution's "externally managed" Python: this is a throw-away machine

# ------------------------------------------------------------------------------------------ 1. torch
cuda_ok() { "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; }
if [ "$DRY" = 1 ]; then
    say "GPU_CHECK_DRY=1: no installs; the gpu cluster runs on the mock backend (CPU), not cuda"
    "$PY" -c "import torch" 2>/dev/null || die3 "dry run needs torch importable by $PY"
else
    if cuda_ok; then
        say "using the installed torch $("$PY" -c 'import torch; print(torch.__version__)') (CUDA available)"
    else
        "$PY" -m pip --version >/dev/null 2>&1 || die3 "$PY has no pip; install pip (or a CUDA torch) first"
        say "installing torch==$TORCH_PIN (CUDA) ..."
        if ! "${PIP[@]}" -q "torch==$TORCH_PIN+cu128" --index-url "$TORCH_INDEX" >"$WORK/pip-torch.log" 2>&1; then
            say "the cu128 index failed ($(tail -n 1 "$WORK/pip-torch.log")); trying the default index"
            # an installed non-CUDA 2.13.0 (+cpu) would satisfy ==2.13.0: replace it
            force=()
            "$PY" -c "import torch" >/dev/null 2>&1 && force=(--force-reinstall)
            "${PIP[@]}" -q ${force[@]+"${force[@]}"} "torch==$TORCH_PIN" >>"$WORK/pip-torch.log" 2>&1 \
                || die3 "cannot install torch==$TORCH_PIN with CUDA (no route to $TORCH_INDEX or PyPI?):" \
                        "$(tail -n 1 "$WORK/pip-torch.log")"
        fi
        cuda_ok || die3 "torch $("$PY" -c 'import torch; print(torch.__version__)' 2>&1 | tail -n 1) is installed" \
                        "but torch.cuda.is_available() is False (driver? CUDA_VISIBLE_DEVICES?)"
        say "installed torch $("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda)')"
    fi
    # ------------------------------------------------------------------ 2. hetauto and its pure-Python deps
    # wheels carried in .whl/ (scripts/gpu-check-wheels.sh fetches them where pip reaches an index): a machine
    # with no route to any index gets its missing pure-Python packages from there
    if compgen -G "$REPO/.whl/*.whl" >/dev/null; then
        say "installing the carried wheels in .whl/ ..."
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            "$REPO"/.whl/*.whl >"$WORK/pip-wheels.log" 2>&1 || die3 "carried wheels: $(tail -n 1 "$WORK/pip-wheels.log")"
        export PYTHONPATH="$PYTHONPATH:/tmp/site"
    fi
    missing=()
    for pair in pluggy:pluggy pydantic:pydantic yaml:pyyaml rich:rich numpy:numpy sklearn:scikit-learn \
                matplotlib:matplotlib; do
        "$PY" -c "import ${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        say "installing ${missing[*]} ..."
        "${PIP[@]}" -q "${missing[@]}" >"$WORK/pip-deps.log" 2>&1 \
            || die3 "cannot install ${missing[*]}: $(tail -n 1 "$WORK/pip-deps.log")"
    fi
    if ! "$PY" -c "import importlib.metadata as m; m.version('hetauto')" >/dev/null 2>&1; then
        if "${PIP[@]}" -q -e . --no-deps >"$WORK/pip-hetauto.log" 2>&1 \
           || "${PIP[@]}" -q -e . --no-deps --no-build-isolation >>"$WORK/pip-hetauto.log" 2>&1; then
            say "installed hetauto (editable)"
        else
            say "pip install -e . failed ($(tail -n 1 "$WORK/pip-hetauto.log")); using the checkout via PYTHONPATH"
        fi
    fi
fi
"$PY" -c "import hetauto.cli" 2>"$WORK/import.log" || die3 "hetauto does not import: $(tail -n 1 "$WORK/import.log")"
say "setup done in $((SECONDS - T0)) s"

# ------------------------------------------------------------------------------------------ 3. plans
# plan (a) and (b) next to their cluster files, with the planner's prediction (step time, peak memory per
# stage) attached so `hetauto run` can report measured vs predicted
"$PY" - "$WORK" "$DRY" <<'EOF'
import json, sys
from pathlib import Path

from hetauto.core.errors import HetautoError
from hetauto.core.plan import Plan, ScheduleSpec, StagePlan, TrainingSpec
from hetauto.core.profile import get_device

work, dry = Path(sys.argv[1]), sys.argv[2] == "1"
device = None
for key in ("h200", "h100"):  # the catalog key for this machine's GPU, whichever exists
    try:
        get_device(key)
        device = key
        break
    except Exception:  # noqa: BLE001 - not in the catalog
        continue
if device is None:
    sys.exit("gpu-check: neither h200 nor h100 is in the device catalog (hetauto devices)")
gpu_backend = "mock" if dry else "cuda"
gpu = f"  - {{name: gpu, nodes: {{count: 1, devices_per_node: 1, device: {device}}}, backend: {gpu_backend}}}\n"
host = "  - {name: host, nodes: {count: 1, devices_per_node: 1, device: cpu}, backend: cpu}\n"
(work / "cluster-a.yaml").write_text("clusters:\n" + gpu)
(work / "cluster-b.yaml").write_text("clusters:\n" + gpu + host +
                                     "links:\n  default: {bandwidth: 10Gbps, latency: 1ms}\n")
model, seq, gbs, mbs = "tiny-gpt", 32, 8, 2  # tiny-gpt: 4 blocks -> 6 layer slots (embedding, blocks, head)
def plan(cluster, stages, precision):
    p = Plan(model=model, cluster=str(work / cluster), seq_len=seq, global_batch=gbs, microbatch_size=mbs,
             num_microbatches=gbs // mbs, stages=stages, schedule=ScheduleSpec(name="1f1b"),
             training=TrainingSpec(precision=precision))
    try:
        from hetauto.planner.evaluate import evaluate_plan
        p = p.model_copy(update={"prediction": evaluate_plan(p).to_prediction()})
    except (ImportError, HetautoError) as err:
        print(f"gpu-check: no prediction for {cluster}: {err}", file=sys.stderr)
    return p
a = plan("cluster-a.yaml", (StagePlan(cluster="gpu", device_type=device, devices=(0,), layers=(0, 6), tp=1, dp=1),),
         "bf16")
b = plan("cluster-b.yaml", (StagePlan(cluster="gpu", device_type=device, devices=(0,), layers=(0, 3), tp=1, dp=1),
                            StagePlan(cluster="host", device_type="cpu", devices=(0,), layers=(3, 6), tp=1, dp=1)),
         "auto")
a.save(work / "plan-a.json")
b.save(work / "plan-b.json")
print(f"gpu-check: wrote {work}/plan-a.json ({model}, 1 stage on {device}/{gpu_backend}, bf16) and "
      f"plan-b.json (stage 0 on {device}/{gpu_backend}, stage 1 on the CPU, precision auto)")
EOF

# ------------------------------------------------------------------------------------------ 4. runs + checks
# check NAME JSON PRECISION GPU_DEVICE GPU_BACKEND TRANSPORT(or -) DRY: prints the figures and the mismatches;
# exit 1 when there is any
check() {
    "$PY" - "$@" <<'EOF'
import json, sys

name, path, want_precision, want_dev, want_backend, want_transport, dry = sys.argv[1:8]
dry = dry == "1"
doc = json.load(open(path))
bad = []
def mismatch(text):
    bad.append(text)
    print(f"  MISMATCH ({name}): {text}")
def mib(n):
    return "-" if n is None else f"{n / 2**20:.1f} MiB"

print(f"[{name}] precision {doc['precision']}, {doc['world_size']} rank(s)")
ref = doc.get("reference_loss") or []
for i, loss in enumerate(doc["loss"]):
    r = ref[i] if i < len(ref) else None
    print(f"  step {doc['start_step'] + i}: loss {loss:.6f}  reference {'-' if r is None else f'{r:.6f}'}  "
          f"diff {'-' if r is None else f'{abs(loss - r):.2e}'}  step {doc['step_s'][i]:.4f} s")
tol, diff = doc.get("loss_tolerance"), doc.get("max_loss_diff")
print(f"  max |loss - reference| {'-' if diff is None else f'{diff:.3e}'} (tolerance {tol})")
if diff is None or tol is None:
    mismatch("no reference loss to compare with")
elif not diff <= tol:
    mismatch(f"max loss diff {diff:.3e} > tolerance {tol}")
if doc["precision"] != want_precision:
    mismatch(f"precision {doc['precision']}, expected {want_precision}")
pred = doc.get("predicted_step_s")
ratio = doc.get("measured_over_predicted")
print(f"  step time: measured {doc['measured_step_s']:.4f} s, predicted "
      f"{'-' if pred is None else f'{pred:.4f} s'} ({doc.get('prediction_source')})"
      + ("" if ratio is None else f", measured/predicted {ratio:.2f}"))
for r in doc["ranks"]:
    print(f"  rank {r['rank']}: stage {r['stage']} cluster {r['cluster']} backend {r['backend']} device {r['device']} "
          f"collectives {r['dist_backend']}")
    if r["cluster"] == "gpu":
        if r["backend"] != want_backend or r["device"].split()[0] != want_dev:
            mismatch(f"rank {r['rank']} (gpu stage) ran on {r['backend']} {r['device']}, "
                     f"expected {want_backend} {want_dev}")
    elif r["cluster"] == "host":
        if r["backend"] != "cpu" or not r["device"].startswith("cpu"):
            mismatch(f"rank {r['rank']} (host stage) ran on {r['backend']} {r['device']}, expected the cpu backend")
for b in doc["boundaries"]:
    print(f"  boundary {b['stage']} -> {b['to_stage']}: transport {b['transport']}, {b['method']}, "
          f"{b['bytes']} bytes/step")
if want_transport != "-":
    got = doc["boundaries"][0]["transport"] if doc["boundaries"] else None
    if got != want_transport:
        mismatch(f"boundaries[0].transport is {got!r}, expected {want_transport!r}")
if doc.get("emulated") or doc.get("emulated_backends"):
    mismatch(f"the run was emulated (emulated={doc.get('emulated')}, emulated_backends={doc.get('emulated_backends')})")
for m in doc["stage_memory"]:
    meas, pr = m["measured_peak_bytes"], m["predicted_peak_bytes"]
    device_stage = m["backend"] not in ("cpu", "mock")
    note = "" if device_stage else "  (host memory of the process: reported, not checked)"
    print(f"  stage {m['stage']} ({m['cluster']}, {m['backend']}): peak memory measured {mib(meas)}, "
          f"predicted {mib(pr)}" + ("" if not meas or not pr else f", measured/predicted {meas / pr:.2f}") + note)
    if device_stage:
        if not meas:
            mismatch(f"stage {m['stage']}: measured peak memory is {meas} (the backend's memory_stats reports nothing)")
        if pr is None:
            mismatch(f"stage {m['stage']}: no predicted peak memory")
        elif meas and meas > pr:
            mismatch(f"stage {m['stage']}: measured peak {mib(meas)} > predicted {mib(pr)} "
                     "(the prediction is not an upper bound)")
print(f"[{name}] {'OK' if not bad else f'{len(bad)} mismatch(es)'}")
sys.exit(1 if bad else 0)
EOF
}

if [ "$DRY" = 1 ]; then GPU_DEV=mock:0; GPU_BACKEND=mock; else GPU_DEV=cuda:0; GPU_BACKEND=cuda; fi
failed=()
run_one() {  # NAME PLAN PRECISION TRANSPORT
    local name=$1 plan=$2 out="$WORK/$1.json" err="$WORK/$1.err" t=$SECONDS rc=0
    say "($name) hetauto run $plan --steps $STEPS --json (timeout ${RUN_TIMEOUT}s)"
    timeout -k 10 "$RUN_TIMEOUT" "$PY" -m hetauto.cli run "$plan" --steps "$STEPS" --json --timeout 120 \
        >"$out" 2>"$err" || rc=$?
    if [ "$rc" -ne 0 ]; then
        [ "$rc" -eq 124 ] && say "($name) timed out after ${RUN_TIMEOUT}s"
        echo "  MISMATCH ($name): hetauto run exited $rc; last lines of its stderr:"
        tail -n 15 "$err" | sed 's/^/    /'
        failed+=("$name")
        return
    fi
    say "($name) finished in $((SECONDS - t)) s"
    check "$name" "$out" "$3" "$GPU_DEV" "$GPU_BACKEND" "$4" "$DRY" || failed+=("$name")
}
run_one a "$WORK/plan-a.json" bf16 -
run_one b "$WORK/plan-b.json" fp32 host

# (c) W sets offloaded on side streams (hetauto.runtime.w_offload.Offloader), one process on cuda:0, a few
# seconds: I then W through the offloader gives the plain backward's gradients bit for bit, and the compute stream
# is not blocked for the copy's duration (events: matmuls beside a copy out take less than alone + half the copy).
# Dry run: the cpu backend (no side streams: synchronous copies), bit-exactness only.
side_streams() {
    timeout -k 10 "$RUN_TIMEOUT" "$PY" - "$DRY" <<'EOF'
import sys, time
import torch
from hetauto.backends import get_backend
from hetauto.runtime import split_backward, w_offload

dry = sys.argv[1] == "1"
be = get_backend("cpu" if dry else "cuda")
dev = torch.device("cpu") if dry else torch.device("cuda", 0)
h, rows = (128, 256) if dry else (4096, 8192)

def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(h, h) for _ in range(4)]).to(dev)

plain, lean = model(), model()
store = split_backward.LeanW.install(lean)
x, g = torch.randn(rows, h, device=dev), torch.randn(rows, h, device=dev)
plain(x).backward(g)
off = w_offload.Offloader(be, dev, pin=be.pin_host_memory)
off.send(0, store.input_grads(lean(x), g))
off.prefetch(0)
split_backward.LeanW.weight_grads(off.take(0))
off.finish()
same = all(torch.equal(a.grad, b.grad) for a, b in zip(plain.parameters(), lean.parameters()))
line = f"gpu-check: (c) W offload on side streams: bit-exact {'yes' if same else 'NO'}"
ok = same
if off.overlapped:
    kept = store.input_grads(lean(x), g)
    nbytes = split_backward.kept_bytes(kept)

    def round_trip(key: int) -> None:  # the host buffers freed again (cached for the next copy out)
        off.prefetch(key)
        off.take(key)
        torch.cuda.synchronize()

    off.send(1, kept)  # warm-up: pinned host buffers allocated once, then cached
    round_trip(1)
    t = time.perf_counter()
    off.send(2, kept)
    off.finish()
    torch.cuda.synchronize()
    copy_s = time.perf_counter() - t
    round_trip(2)
    a = torch.randn(8192, 8192, device=dev)

    def compute_s(n: int, beside: bool) -> float:
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        if beside:
            off.send(3, kept)
        for _ in range(n):
            a @ a
        e.record()
        if beside:
            round_trip(3)
        torch.cuda.synchronize()
        return s.elapsed_time(e) / 1e3

    one = compute_s(1, False)
    n = max(1, int(2 * copy_s / max(one, 1e-6)))
    alone, beside = compute_s(n, False), compute_s(n, True)
    overlapped = beside < alone + 0.5 * copy_s
    ok = ok and overlapped
    line += (f"; {nbytes / 2**20:.0f} MiB out in {copy_s * 1e3:.1f} ms; compute {alone * 1e3:.1f} ms alone, "
             f"{beside * 1e3:.1f} ms beside the copy: {'overlapped' if overlapped else 'BLOCKED'}")
else:
    line += " (no side streams on this backend: copies in line)"
print(line + ("" if ok else "  MISMATCH"))
sys.exit(0 if ok else 1)
EOF
}
side_streams || failed+=(c)

say "total $((SECONDS - T0)) s"
if [ ${#failed[@]} -gt 0 ]; then
    say "FAILED: ${failed[*]}"
    exit 1
fi
say "all checks passed$([ "$DRY" = 1 ] && echo ' (dry run: mock instead of cuda)')"
