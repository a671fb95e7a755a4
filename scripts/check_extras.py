"""Check that each vendor extra of hetauto installs next to the torch that is already installed.

Why: torch-npu (and IPEX) are built for exactly one torch release. An extra that names a release built for
another torch makes `pip install "hetauto[npu]"` silently replace the user's torch (an unbounded
`torch-npu>=2.6.0` resolved torch-npu 2.14.0 and swapped torch 2.13 for 2.14), or installs a package
that dies on import. This script asks pip's resolver what `pip install ".[EXTRA]"` would do here
(`--dry-run --report`, nothing is installed), against the torch installed now, and fails when the
answer installs or replaces torch, or installs a package that pins, or is versioned for, another torch.

    python scripts/check_extras.py [EXTRA ...]      # default: npu xpu cuda rocm; exit 1 on any failure

Standard library only; needs pip >= 22.2 and the package index (PyPI) reachable.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = ("npu", "xpu", "cuda", "rocm")
PIP_TIMEOUT_S = 150  # per extra; a resolve that only needs metadata takes seconds
# Fail fast when the index is unreachable. One retry (not zero): pip prints the connection error only as
# a "Retrying" warning. Set in the environment, not as flags, so that the pip which installs the build
# backend into its isolated environment (a child of ours) inherits them too.
PIP_ENV = {"PIP_RETRIES": "1", "PIP_TIMEOUT": "20", "PIP_DEFAULT_TIMEOUT": "20"}
# Released in lockstep with torch: version X.Y.* works only with torch X.Y.*. IPEX declares no torch
# requirement at all but exits on import when torch's X.Y differs, so its version is checked instead.
LOCKSTEP = {"torch-npu", "intel-extension-for-pytorch"}
UNREACHABLE = "pip could not reach the package index"
NETWORK_ERRORS = (
    "NewConnectionError", "Max retries exceeded", "ConnectTimeout", "ReadTimeout", "Connection refused",
    "Temporary failure in name resolution", "Name or service not known", "Network is unreachable",
    "Could not fetch URL", "ProxyError", "SSLError",
)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def release(version: str) -> tuple[int, ...]:
    """The leading numeric release segment: "2.13.0+cpu" -> (2, 13, 0), "2.12.0.post3" -> (2, 12, 0)."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    return tuple(int(part) for part in match.group(1).split(".")) if match else ()


def _padded(parts: tuple[int, ...], length: int) -> tuple[int, ...]:
    return parts + (0,) * (length - len(parts))


def matches_pin(version: str, pin: str) -> bool:
    """Whether `version` satisfies `==pin` (PEP 440: "X.Y.*" is a prefix match; a local label such as
    "+cpu" on the installed version is ignored)."""
    public = version.split("+", 1)[0]
    if pin.endswith(".*"):
        prefix = release(pin[:-2])
        return _padded(release(public), len(prefix))[: len(prefix)] == prefix
    if re.fullmatch(r"\d+(\.\d+)*", pin) and re.fullmatch(r"\d+(\.\d+)*", public):
        n = max(len(release(pin)), len(release(public)))
        return _padded(release(pin), n) == _padded(release(public), n)
    return public == pin


def torch_requirements(requires_dist: list[str] | None) -> list[str]:
    """The unconditional requirements on torch, spaces removed: ["torch==2.13.0.*"]. Requirements that
    only apply with one of the package's own extras (`; extra == "x"`) are left out."""
    found = []
    for requirement in requires_dist or []:
        spec, _, marker = requirement.partition(";")
        name = re.match(r"\s*([A-Za-z0-9._-]+)", spec)
        if name and canonical(name.group(1)) == "torch" and "extra" not in marker:
            found.append(re.sub(r"[\s()]", "", spec))
    return found


def other_torch_pins(requirements: list[str], torch_version: str) -> list[str]:
    """The torch requirements whose `==` clause the installed torch does not satisfy."""
    bad = []
    for requirement in requirements:
        pins = re.findall(r"(?<![=!<>~])==(?!=)([^,]+)", requirement)
        if any(not matches_pin(torch_version, pin) for pin in pins):
            bad.append(requirement)
    return bad


def report_problems(extra: str, report: dict[str, Any], torch_version: str) -> list[str]:
    """One line per problem in a `pip install --report` JSON for `.[extra]`; empty when it is fine."""
    problems = []
    for item in report.get("install", []):
        name, version = canonical(item["metadata"]["name"]), item["metadata"]["version"]
        if name == "torch":  # the worst problem, listed first
            problems.insert(0, f"{extra}: would replace torch {torch_version} with torch=={version}")
            continue
        requirements = torch_requirements(item["metadata"].get("requires_dist"))
        for requirement in other_torch_pins(requirements, torch_version):
            problems.append(f"{extra}: {name}=={version} requires {requirement}, installed torch is {torch_version}")
        if name in LOCKSTEP and not requirements and release(version)[:2] != release(torch_version)[:2]:
            built_for = ".".join(str(part) for part in release(version)[:2])
            problems.append(f"{extra}: {name}=={version} is built for torch {built_for}.*, installed torch is {torch_version}")
    return problems


def report_summary(report: dict[str, Any]) -> str:
    """What the extra adds, hetauto itself left out: "would install torch-npu==2.13.0 (requires torch==2.13.0.*)"."""
    added = []
    for item in report.get("install", []):
        name, version = canonical(item["metadata"]["name"]), item["metadata"]["version"]
        if name == "hetauto" and item.get("requested"):
            continue
        requirements = torch_requirements(item["metadata"].get("requires_dist"))
        added.append(f"{name}=={version}" + (f" (requires {', '.join(requirements)})" if requirements else ""))
    return "would install " + ", ".join(added) if added else "would install nothing new"


def pip_failure(extra: str, output: str) -> str:
    """One line for a pip run that failed, saying whether the index was unreachable."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")] or lines or ["(no output)"]
    markers = [marker for marker in NETWORK_ERRORS if marker in output]
    if markers:
        errno = re.search(r"\[Errno[^\]]*\][^'\")]*", output)
        return f"{extra}: {UNREACHABLE} ({errno.group(0).strip() if errno else markers[0]}); check the network or the index settings"
    return f"{extra}: pip could not resolve .[{extra}]: {errors[-1]}"


def check_extra(extra: str, torch_version: str) -> tuple[bool, list[str]]:
    """Dry-run `pip install ".[extra]"` from the repository root; (passed, lines to print)."""
    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-input",
                   "--disable-pip-version-check", "--report", str(report_path), f".[{extra}]"]
        try:
            done = subprocess.run(command, cwd=ROOT, env={**os.environ, **PIP_ENV}, capture_output=True,
                                  text=True, timeout=PIP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return False, [f"{extra}: {UNREACHABLE}: pip did not finish within {PIP_TIMEOUT_S}s"]
        if done.returncode != 0 or not report_path.exists():
            return False, [pip_failure(extra, done.stderr + done.stdout)]
        report = json.loads(report_path.read_text())
    problems = report_problems(extra, report, torch_version)
    return (False, problems) if problems else (True, [f"{extra}: ok, {report_summary(report)}"])


def main(argv: list[str]) -> int:
    extras = argv or list(EXTRAS)
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        print("torch is not installed: install the torch hetauto runs on first (CI: pip install torch==2.13.0)")
        print(f"0 passed, {len(extras)} failed")
        return 1
    passed = failed = 0
    unreachable = False
    for extra in extras:
        if unreachable:  # do not wait out the same network timeout once per extra
            ok, lines = False, [f"{extra}: not checked, the package index is unreachable"]
        else:
            ok, lines = check_extra(extra, torch_version)
            unreachable = any(UNREACHABLE in line for line in lines)
        passed, failed = passed + ok, failed + (not ok)
        print("\n".join(lines), flush=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
