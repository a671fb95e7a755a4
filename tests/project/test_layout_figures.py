"""benchmarks/layout_figures.py's static figures, on a small tree written here: what counts as a module naming a knob,
how a function's length is measured and named, and the size of runtime/. (The traced run path runs `hetauto run`:
too slow for the suite; the script is run by hand before and after a change to the layout.)"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import layout_figures  # noqa: E402


def _tree(root: Path) -> Path:
    files = {
        "hetauto/runtime/__init__.py": "",
        "hetauto/runtime/optim.py": "def make(training):\n    return training.weight_decay\n",
        "hetauto/core/run_config.py": "class TrainingConfig:\n    weight_decay: float = 0.01\n",
        "hetauto/core/run_config_cli.py": 'FLAG_ORDER = ("--weight-decay",)\n',
        "hetauto/core/notes.py": '"""weight_decay is only mentioned here."""\n# weight_decay\n',
        "hetauto/job/long.py": ("class Service:\n    def run(self):\n" + "        x = 1\n" * 90
                                + "        def inner():\n            return x\n        return inner\n"),
    }
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def test_a_knob_is_named_by_an_identifier_or_its_flag_not_by_a_docstring_or_comment(tmp_path: Path) -> None:
    found = layout_figures.knob_modules(_tree(tmp_path), ("weight_decay",))
    assert found == {"weight_decay": ["hetauto/core/run_config.py", "hetauto/core/run_config_cli.py",
                                      "hetauto/runtime/optim.py"]}


def test_functions_are_measured_from_def_to_last_line_and_named_by_their_class(tmp_path: Path) -> None:
    funcs = layout_figures.functions(_tree(tmp_path))
    assert [(f.name, f.lines, f.where) for f in funcs] == [("Service.run", 94, "hetauto/job/long.py:2"),
                                                           ("Service.run.inner", 2, "hetauto/job/long.py:93"),
                                                           ("make", 2, "hetauto/runtime/optim.py:1")]


def test_runtime_size_counts_its_files_and_lines(tmp_path: Path) -> None:
    assert layout_figures.runtime_size(_tree(tmp_path)) == {"files": 2, "lines": 2}


def test_the_static_figures_of_this_checkout(capsys) -> None:
    assert layout_figures.main(["--no-trace", "--knob", "weight_decay"]) == 0
    out = capsys.readouterr().out
    assert "hetauto/runtime/:" in out and "15 longest functions" in out and "weight_decay" in out
