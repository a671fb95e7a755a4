"""Reading user-supplied YAML/JSON documents and turning validation failures into one-line `SpecError`s.

Every loader of a user file (cluster, model config, profile, plan) goes through here so that errors look
the same everywhere: `FILE: path.to.field: what is wrong (what would be right)`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from hetauto.core.errors import SpecError

M = TypeVar("M", bound=BaseModel)


# Why a ceiling: pure-Python PyYAML parsed a 1.4 MiB cluster file in 28 s here, so 11 MiB ran for minutes without
# a word; specs are a few KiB (the largest in the repository is far below 100 KiB).
MAX_YAML_CHARS = 4 << 20
# Why a nesting bound: PyYAML's scanner rechecks every open flow level on each token, so `[[[[...` costs the square
# of its depth before the composer's recursion gives up; where a library has raised the recursion limit (torch's
# compiler does, to 2000+), 50,000 brackets ran 10 s. A spec nests a handful of levels.
MAX_FLOW_DEPTH = 100
_QUOTED_OR_COMMENT = re.compile(r"'[^']*'|\"(?:\\.|[^\"\\])*\"|(?:^|(?<=\s))#[^\n]*", re.MULTILINE)
_BRACKET = re.compile(r"[\[\]{}]")


def read_document(path: str | Path) -> Any:
    """Parse a .yaml/.yml/.json file (by suffix; other suffixes are tried as YAML, a superset of JSON)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(p, "", "file not found", "check the path") from None
    except IsADirectoryError:
        raise SpecError(p, "", "is a directory, not a file", "pass a .yaml or .json file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(p, "", f"cannot read file: {exc}") from None
    return parse_text(text, p)


def parse_text(text: str, source: str | Path | None = None) -> Any:
    """Parse YAML or JSON text; syntax errors become a SpecError with the line number."""
    is_json = source is not None and str(source).endswith(".json")
    if not is_json and len(text) > MAX_YAML_CHARS:
        raise SpecError(source, "", f"{len(text) / 2**20:.1f} MiB of YAML is more than the {MAX_YAML_CHARS >> 20} MiB "
                        "hetauto parses (it would parse for minutes; a spec is a few KiB)",
                        "trim it, or write it as .json")
    if not is_json and _flow_depth(text) > MAX_FLOW_DEPTH:
        raise SpecError(source, "", f"document nests more than {MAX_FLOW_DEPTH} levels deep",
                        "a cluster, model or profile spec nests a few levels: is this the right file?")
    try:
        if is_json:
            return loads_json(text, source)
        return yaml.load(text, Loader=_loader_for(text))  # noqa: S506 - SafeLoader subclasses
    except json.JSONDecodeError as exc:
        raise SpecError(source, f"line {exc.lineno}", f"invalid JSON: {exc.msg}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(source, line, f"invalid YAML: {problem}") from None
    except RecursionError:
        raise SpecError(source, "", "document nests too deeply") from None


class _UniqueKeys:
    """A SafeLoader mixin refusing a key given twice in one mapping (PyYAML keeps the last silently, so a
    second `bandwidth:` under a link would quietly replace the first). Keys merged in with `<<:` may still be
    overridden, as YAML means."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                    continue
                key = self.construct_object(key_node)
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key '{key}' (also on line {seen[key]}); give each key once",
                        key_node.start_mark)
                seen[key] = line
        return yaml.constructor.SafeConstructor.construct_mapping(self, node, deep=deep)  # type: ignore[arg-type]


class _UniqueKeyLoader(_UniqueKeys, yaml.SafeLoader):
    """yaml.safe_load's loader, refusing a key given twice in one mapping."""


# libyaml's parser where PyYAML was built with it (7x faster: a plan reads ~30 documents), with the very same
# constructor. Only a syntax error's wording differs from PyYAML's own parser.
_FAST_LOADER = type("_FastUniqueKeyLoader", (_UniqueKeys, yaml.CSafeLoader), {}) if yaml.__with_libyaml__ else None
# libyaml's composer recurses on the C stack with no limit: `- - - ... x` 50,000 deep crashed the process (20,000
# parsed). A node's depth is at most twice its line's length (each level takes an indentation column or an inline
# `- `/`? `/`: `; a mapping's compact sequence shares its key's column) plus the flow depth: below this bound libyaml
# is safe, above it PyYAML's parser says "nests too deeply" (or parses a long line, slowly).
_FAST_MAX_DEPTH = 5000


def _loader_for(text: str) -> type:
    """The fast loader where the document cannot nest deeply enough to crash it, else PyYAML's."""
    if _FAST_LOADER is None or 2 * max(map(len, text.splitlines()), default=0) + MAX_FLOW_DEPTH > _FAST_MAX_DEPTH:
        return _UniqueKeyLoader
    return _FAST_LOADER


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def loads_json(text: str, source: str | Path | None = None) -> Any:
    """json.loads refusing a key given twice in one object (json.loads keeps the last silently): a SpecError
    naming the key and the line of its second occurrence."""
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs)
    except _DuplicateKey as dup:
        needle = json.dumps(dup.key)
        lines = [i + 1 for i, line in enumerate(text.splitlines()) for _ in range(line.count(needle))]
        where = f"line {lines[1]}" if len(lines) > 1 else ""
        raise SpecError(source, where, f"duplicate key {needle}" + (f" (also on line {lines[0]})" if lines else ""),
                        "give each key once") from None


def _flow_depth(text: str) -> int:
    """The deepest `[`/`{` nesting outside quotes and comments (a plain scalar's stray bracket may count: an upper
    bound, cheap: one pass over the brackets)."""
    depth = deepest = 0
    for m in _BRACKET.finditer(_QUOTED_OR_COMMENT.sub("", text)):
        depth = depth + 1 if m.group() in "[{" else max(0, depth - 1)
        deepest = max(deepest, depth)
    return deepest


def field_path(loc: tuple[Any, ...]) -> str:
    """Render a pydantic location tuple as `clusters[0].nodes.count`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names (aliases where set) a pydantic `model` accepts at the mapping holding `loc[-1]`."""
    import typing

    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        fields = current.model_fields if isinstance(current, type) and issubclass(current, BaseModel) else {}
        field = fields.get(part) or next((f for f in fields.values() if f.alias == part), None)
        if field is None:
            return []
        nxt = None
        for cand in (field.annotation, *typing.get_args(field.annotation)):
            for inner in (cand, *typing.get_args(cand)):
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    nxt = inner
        if nxt is None:
            return []
        current = nxt
    if not (isinstance(current, type) and issubclass(current, BaseModel)):
        return []
    return [f.alias or name for name, f in current.model_fields.items()]


def spec_error_from_validation(source: str | Path | None, exc: ValidationError,
                               model: type[BaseModel] | None = None) -> SpecError:
    """The first validation error, as a one-line SpecError (with a count of the others). An unknown field
    names the closest field `model` accepts there, when one is close."""
    import difflib

    errors = exc.errors(include_url=False)
    # a misspelt key is also a missing one: name the misspelling, the cause, first
    first = next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0])
    msg = str(first.get("msg", "invalid value"))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    fix = None
    loc = tuple(first.get("loc", ()))
    if first.get("type") == "extra_forbidden":
        msg = "unknown field"
        if model is not None and loc and isinstance(loc[-1], str):
            close = difflib.get_close_matches(loc[-1], fields_at(model, loc), n=1, cutoff=0.6)
            fix = f"did you mean '{close[0]}'?" if close else None
    elif first.get("type") == "missing":
        msg = "required field is missing"
    more = f" (and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return SpecError(source, field_path(loc), msg + more, fix)


def validate_document(model: type[M], data: Any, source: str | Path | None = None) -> M:
    """Validate parsed data against a pydantic model; any failure is a SpecError, never another exception."""
    if not isinstance(data, dict):
        raise SpecError(source, "", f"expected a mapping at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise spec_error_from_validation(source, exc, model) from None
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise SpecError(source, "", f"invalid document: {exc}") from None


def load_model_file(model: type[M], path: str | Path) -> M:
    return validate_document(model, read_document(path), path)
