"""The executor never names a vendor: everything device-specific comes through the backend contract. This
reads the code of hetauto/runtime (names, attributes and string constants; docstrings and comments may
explain vendors) and fails on any vendor or vendor-library name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import hetauto.runtime

VENDOR_WORDS = ("cuda", "rocm", "hip", "npu", "xpu", "nccl", "rccl", "hccl", "xccl", "torch_npu", "ipex")


def _code_words(source: str) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            out.append((node.lineno, node.attr))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            out.append((node.lineno, node.value))
        elif isinstance(node, ast.alias):
            out.append((getattr(node, "lineno", 0), node.name))
    return out


def _vendor_hits(source: str) -> list[str]:
    """`line: word` for each name or string constant with a vendor word in it (split on non-alphanumerics)."""
    return [f"{line}: {word!r}" for line, word in sorted(_code_words(source))
            if set(re.findall(r"[a-z0-9]+", word.lower())) & set(VENDOR_WORDS) or "torch_npu" in word.lower()]


def test_no_runtime_module_names_a_vendor() -> None:
    found = [f"{path.name}:{hit}" for path in sorted(Path(hetauto.runtime.__file__).parent.glob("*.py"))
             for hit in _vendor_hits(path.read_text(encoding="utf-8"))]
    assert found == []


def test_the_check_catches_a_vendor_name_in_code_but_not_in_a_docstring() -> None:
    source = '"""cuda is explained here"""\nx = torch.cuda.is_available()\ny = f"{a}:hccl"\nimport torch_npu\n'
    assert _vendor_hits(source) == ["2: 'cuda'", "3: ':hccl'", "4: 'torch_npu'"]
