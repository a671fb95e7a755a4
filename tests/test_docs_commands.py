"""Every command the README and docs/ show as runnable runs: fenced ```bash / ```python blocks right after an
HTML comment `<!-- runnable -->`. Each document's blocks run in order in one fresh folder (a later block may use
what an earlier one wrote, e.g. plan.json) that links to the checkout's plugins/, benchmarks/, scripts/, examples/ and pyproject.toml, so
commands read as if run from the repository root. Longer commands are shown unmarked (the docs say which).
The whole test takes ~45 s here (one emulated training run of one step); keep it under ~60 s."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"<!--\s*runnable\s*-->\s*\n```(bash|python)\n(.*?)\n```((?:\s*<!--\s*output:.*?-->)*)",
                   re.DOTALL)
# after a runnable block, `<!-- output: TEXT -->` lines: the block's output must contain each TEXT (spaces
# collapsed), so a figure the prose quotes from that output cannot drift from what the tool prints
OUTPUT = re.compile(r"<!--\s*output:\s*(.*?)\s*-->", re.DOTALL)
LINKED = ("plugins", "benchmarks", "scripts", "examples", "pyproject.toml")


def runnable_blocks(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(text)]


def expected_outputs(text: str) -> list[list[str]]:
    """Per runnable block (in order), the texts its output must contain."""
    return [OUTPUT.findall(m.group(3) or "") for m in BLOCK.finditer(text)]


def _squash(text: str) -> str:
    return " ".join(text.split())


def test_marker_finds_only_marked_blocks() -> None:
    text = "```bash\nnot me\n```\n<!-- runnable -->\n```bash\necho a\necho b\n```\n<!-- runnable -->\n```python\nx = 1\n```"
    assert runnable_blocks(text) == [("bash", "echo a\necho b"), ("python", "x = 1")]


def test_output_markers_belong_to_the_block_before_them() -> None:
    text = ("<!-- runnable -->\n```bash\necho a\n```\n<!-- output: a -->\n<!-- output: b c -->\n"
            "<!-- runnable -->\n```bash\necho d\n```\n")
    assert runnable_blocks(text) == [("bash", "echo a"), ("bash", "echo d")]
    assert expected_outputs(text) == [["a", "b c"], []]


def test_every_document_with_commands_marks_some() -> None:
    """A doc the README links to and that shows commands marks at least one block runnable (the plugin guide and
    the baselines notes are walk-throughs/notes outside a checkout's tiny scenarios)."""
    for name in ("README.md", "docs/planning.md", "docs/running.md", "docs/calibration.md", "docs/architecture.md"):
        assert runnable_blocks((ROOT / name).read_text(encoding="utf-8")), f"{name} marks no block runnable"


def test_jobs_table_examples_are_run() -> None:
    """The README's three-jobs table shows commands that its runnable block runs."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text[text.index("## Three jobs"):text.index("<!-- runnable -->")]
    examples = re.findall(r"^\| [a-z ]+ \| `([^`]+)` \|", table, re.MULTILINE)
    assert len(examples) == 3
    run = "\n".join(code for _, code in runnable_blocks(text))
    for example in examples:
        assert example in run


def _env(folder: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.pop("HETAUTO_BACKEND", None)
    env["HOME"] = str(folder / "home")  # no calibration cache of the developer's: the docs' first-run view
    (folder / "home").mkdir(exist_ok=True)
    return env


# the documents that mark blocks runnable (the others are read, not run: nothing to skip)
RUNNABLE = [d for d in DOCS if runnable_blocks(d.read_text(encoding="utf-8"))]


def test_the_main_documents_mark_runnable_blocks() -> None:
    assert {d.name for d in RUNNABLE} >= {"README.md", "planning.md", "running.md"}


@pytest.mark.multiprocess
@pytest.mark.parametrize("doc", RUNNABLE, ids=lambda p: str(p.relative_to(ROOT)))
def test_runnable_commands_run(doc: Path, tmp_path: Path) -> None:
    blocks = runnable_blocks(doc.read_text(encoding="utf-8"))
    expected = expected_outputs(doc.read_text(encoding="utf-8"))
    for name in LINKED:
        (tmp_path / name).symlink_to(ROOT / name)
    env = _env(tmp_path)
    for (lang, code), wanted in zip(blocks, expected):
        if lang == "bash":
            cmd = ["bash", "-euo", "pipefail", "-c", code]
        else:
            cmd = [sys.executable, "-c", code]
        out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False)
        assert out.returncode == 0, (f"{doc.name}: this {lang} block failed (exit {out.returncode}):\n{code}\n"
                                     f"--- stdout ---\n{out.stdout[-3000:]}\n--- stderr ---\n{out.stderr[-3000:]}")
        for text in wanted:
            assert _squash(text) in _squash(out.stdout), (f"{doc.name}: the prose quotes {text!r} from this block's "
                                                          f"output, which no longer says it:\n{code}\n--- stdout "
                                                          f"---\n{out.stdout[-3000:]}")


def test_docs_speak_to_a_user_not_to_the_developers() -> None:
    """A user has neither our issue tracker nor the development workspace: the docs never send them there."""
    workspace = re.compile(r"\b[Ii]ssues? #?\d+|\bthis VM\b|\.\./shared/")
    found = [f"{d.relative_to(ROOT)}:{n}: {line.strip()}" for d in DOCS
             for n, line in enumerate(d.read_text(encoding="utf-8").splitlines(), 1) if workspace.search(line)]
    assert found == []
