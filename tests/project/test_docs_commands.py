"""Every command the README and docs/ show as runnable runs (tests/_docs_commands.py says how): the documents
without a file of their own here, the README's, planning's and running's in tests/project/test_docs_commands_<doc>.py.
Longer commands are shown unmarked (the docs say which). Each document takes well under a minute here (the README:
one emulated training run of one step); keep it so."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from _docs_commands import DOCS, OWN_FILE, ROOT, RUNNABLE, expected_outputs, run_document, runnable_blocks


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


def test_the_main_documents_mark_runnable_blocks() -> None:
    assert {d.name for d in RUNNABLE} >= {"README.md", "planning.md", "running.md"}


def test_the_documents_run_from_their_own_files_have_one() -> None:
    """Every runnable document runs: here, or from the file OWN_FILE promises it (which runs that document)."""
    here = Path(__file__).resolve().parent
    for name in OWN_FILE:
        own = here / f"test_docs_commands_{Path(name).stem.lower()}.py"
        assert own.is_file() and f"\"{name}\"" in own.read_text(encoding="utf-8"), f"{name} has no {own.name}"


@pytest.mark.multiprocess
@pytest.mark.parametrize("doc", [d for d in RUNNABLE if str(d.relative_to(ROOT)) not in OWN_FILE],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_runnable_commands_run(doc: Path, tmp_path: Path) -> None:
    run_document(doc, tmp_path)


def test_docs_speak_to_a_user_not_to_the_developers() -> None:
    """A user has neither our issue tracker nor the development workspace: the docs never send them there."""
    workspace = re.compile(r"\b[Ii]ssues? #?\d+|\bthis VM\b|\.\./shared/")
    found = [f"{d.relative_to(ROOT)}:{n}: {line.strip()}" for d in DOCS
             for n, line in enumerate(d.read_text(encoding="utf-8").splitlines(), 1) if workspace.search(line)]
    assert found == []
