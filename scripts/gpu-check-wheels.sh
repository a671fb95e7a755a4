#!/usr/bin/env bash
# Fetch, as Python 3.12 x86-64 wheels into .whl/, the pure-Python packages hetauto needs that a bare GPU image
# may lack (it has torch, numpy, pluggy, pyyaml, rich, scikit-learn, matplotlib, but not pydantic), for a
# machine that cannot reach a package index: scripts/gpu-check.sh installs whatever .whl/ holds.
# Run it where pip reaches PyPI. .whl/ is ignored by git (.git/info/exclude) but travels when carried.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
# pydantic and its own needs, pinned to the versions this checkout is tested with
pins=$(python3 - <<'PY'
import importlib.metadata as m
for name in ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions"):
    print(f"{name}=={m.version(name)}")
PY
)
# shellcheck disable=SC2086
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl $pins
ls -1 .whl
