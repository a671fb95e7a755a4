"""Running the docs' runnable commands (tests/project/test_docs_commands*.py): fenced ```bash / ```python blocks right after
an HTML comment `<!-- runnable -->`. Each document's blocks run in order in one fresh folder (a later block may use
what an earlier one wrote, e.g. plan.json) that links to the checkout's plugins/, benchmarks/, scripts/, examples/
and pyproject.toml, so commands read as if run from the repository root.

Why a module of its own: the README's, planning's and running's blocks take a minute or more each on a small
machine, and the suite hands whole files to its workers (scripts/test.sh, --dist loadfile): each of them runs from
a file of its own, so one worker does not run them all one after the other."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"<!--\s*runnable\s*-->\s*\n```(bash|python)\n(.*?)\n```((?:\s*<!--\s*output:.*?-->)*)",
                   re.DOTALL)
# after a runnable block, `<!-- output: TEXT -->` lines: the block's output must contain each TEXT (spaces
# collapsed), so a figure the prose quotes from that output cannot drift from what the tool prints
OUTPUT = re.compile(r"<!--\s*output:\s*(.*?)\s*-->", re.DOTALL)
LINKED = ("plugins", "benchmarks", "scripts", "examples", "pyproject.toml")
# the documents whose blocks run from a file of their own (tests/project/test_docs_commands_<stem>.py, lower case)
OWN_FILE = ("README.md", "docs/planning.md", "docs/running.md")


def runnable_blocks(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(text)]


def expected_outputs(text: str) -> list[list[str]]:
    """Per runnable block (in order), the texts its output must contain."""
    return [OUTPUT.findall(m.group(3) or "") for m in BLOCK.finditer(text)]


def _squash(text: str) -> str:
    return " ".join(text.split())


def _env(folder: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.pop("HETAUTO_BACKEND", None)
    env["HOME"] = str(folder / "home")  # no calibration cache of the developer's: the docs' first-run view
    (folder / "home").mkdir(exist_ok=True)
    return env


# the documents that mark blocks runnable (the others are read, not run: nothing to skip)
RUNNABLE = [d for d in DOCS if runnable_blocks(d.read_text(encoding="utf-8"))]


def run_document(doc: Path, folder: Path) -> None:
    """Run `doc`'s runnable blocks in order in `folder`; each must exit 0 and print what its output markers quote."""
    blocks = runnable_blocks(doc.read_text(encoding="utf-8"))
    expected = expected_outputs(doc.read_text(encoding="utf-8"))
    for name in LINKED:
        (folder / name).symlink_to(ROOT / name)
    env = _env(folder)
    for (lang, code), wanted in zip(blocks, expected):
        if lang == "bash":
            cmd = ["bash", "-euo", "pipefail", "-c", code]
        else:
            cmd = [sys.executable, "-c", code]
        out = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=240, check=False)
        assert out.returncode == 0, (f"{doc.name}: this {lang} block failed (exit {out.returncode}):\n{code}\n"
                                     f"--- stdout ---\n{out.stdout[-3000:]}\n--- stderr ---\n{out.stderr[-3000:]}")
        for text in wanted:
            assert _squash(text) in _squash(out.stdout), (f"{doc.name}: the prose quotes {text!r} from this block's "
                                                          f"output, which no longer says it:\n{code}\n--- stdout "
                                                          f"---\n{out.stdout[-3000:]}")
