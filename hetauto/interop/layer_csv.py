"""Measured per-layer rows from a plain CSV, so a measurement from any tool can price plans.

One header line, then one row per measured layer (docs/calibration.md, "Measured layer rows"):

    device,kind,tp,microbatch,seq_len,precision,fwd_ms,bwd_ms,mem_mb,model
    a100-80g,block,1,1,1024,bf16,9.5,19.0,4146,gpt3-1.3b

`device` a catalog key or profile name the row was measured on, `kind` embedding|block|head, `tp` and
`microbatch` (per device) integers >= 1, `seq_len` >= 1, `precision` bf16|fp16|fp32, `fwd_ms`/`bwd_ms`
milliseconds >= 0, `mem_mb` MiB (may be empty). Optional columns: `model` (the model name the row measured;
else the importer's --model) and `hidden` (its hidden size). Any other column is an error, so a misspelt
one never drops silently.
"""

from __future__ import annotations

import csv
from pathlib import Path

from pydantic import ValidationError

from hetauto.core.errors import SpecError
from hetauto.core.profile import LAYER_KINDS, ROW_PRECISIONS, LayerRow

REQUIRED = ("device", "kind", "tp", "microbatch", "seq_len", "precision", "fwd_ms", "bwd_ms", "mem_mb")
OPTIONAL = ("model", "hidden")


def _number(text: str, path: Path, line: int, col: str, *, integer: bool, minimum: float) -> float:
    what = "an integer" if integer else "a number"
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        example = "1, 2, 4" if integer else "12.5"
        raise SpecError(path, f"line {line}, column {col}", f"{text!r} is not {what}",
                        f"write {what} >= {minimum:g} there, e.g. {example}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise SpecError(path, f"line {line}, column {col}", f"{text!r} is not a finite number",
                        f"write {what} >= {minimum:g} there (a measurement that failed has no row: leave the line out)")
    if not value >= minimum:
        raise SpecError(path, f"line {line}, column {col}", f"{text!r} is below {minimum:g}",
                        f"write {what} >= {minimum:g} there")
    return value


def read_layer_csv(path: str | Path, model: str | None = None) -> list[tuple[str, LayerRow]]:
    """(device, row) for every data line of the CSV at `path`; `model` fills rows without a `model` cell.
    Bad input: a SpecError naming the file, the line, the column and the fix."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig")
    except OSError as err:
        raise SpecError(p, "", f"cannot read it: {err.strerror or err}", "give an existing CSV file") from None
    except UnicodeDecodeError:
        raise SpecError(p, "", "is not UTF-8 text", "save the CSV as UTF-8") from None
    lines = list(csv.reader(text.splitlines()))
    if not lines or not any(cell.strip() for cell in lines[0]):
        raise SpecError(p, "line 1", "no header line", f"start the file with the header {','.join(REQUIRED)}")
    header = [c.strip() for c in lines[0]]
    unknown = [c for c in header if c not in REQUIRED + OPTIONAL]
    if unknown:
        raise SpecError(p, f"line 1, column {unknown[0]}", "unknown column",
                        f"columns are {', '.join(REQUIRED)} and optionally {', '.join(OPTIONAL)}")
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise SpecError(p, "line 1", f"missing column {missing[0]}",
                        f"the header must name {', '.join(REQUIRED)}")
    out: list[tuple[str, LayerRow]] = []
    for n, cells in enumerate(lines[1:], start=2):
        if not any(c.strip() for c in cells):
            continue
        if len(cells) != len(header):
            raise SpecError(p, f"line {n}", f"has {len(cells)} fields but the header has {len(header)}",
                            "give one value per column (leave mem_mb empty rather than out)")
        cell = {h: c.strip() for h, c in zip(header, cells)}
        kind, precision = cell["kind"], cell["precision"]
        if kind not in LAYER_KINDS:
            raise SpecError(p, f"line {n}, column kind", f"{kind!r} is not a layer kind",
                            f"use one of {', '.join(LAYER_KINDS)}")
        if precision not in ROW_PRECISIONS:
            raise SpecError(p, f"line {n}, column precision", f"{precision!r} is not a precision",
                            f"use one of {', '.join(ROW_PRECISIONS)}")
        if not cell["device"]:
            raise SpecError(p, f"line {n}, column device", "is empty", "name the device the row was measured on")
        nums = {col: _number(cell[col], p, n, col, integer=col in ("tp", "microbatch", "seq_len"),
                             minimum=1 if col in ("tp", "microbatch", "seq_len") else 0)
                for col in ("tp", "microbatch", "seq_len", "fwd_ms", "bwd_ms")}
        mem = _number(cell["mem_mb"], p, n, "mem_mb", integer=False, minimum=0) if cell["mem_mb"] else None
        hidden = (int(_number(cell["hidden"], p, n, "hidden", integer=True, minimum=1))
                  if cell.get("hidden") else None)
        name = cell.get("model") or model
        if name is None and hidden is None:
            raise SpecError(p, f"line {n}, column model", "the row names no model",
                            "add a model column, or pass --model NAME for rows that leave it empty")
        try:
            row = LayerRow(kind=kind, tp=int(nums["tp"]), microbatch=int(nums["microbatch"]),  # type: ignore[arg-type]
                           seq_len=int(nums["seq_len"]), precision=precision,  # type: ignore[arg-type]
                           forward_ms=nums["fwd_ms"], backward_ms=nums["bwd_ms"], memory_mb=mem, model=name,
                           hidden=hidden, origin=f"{p.name}:{n}")
        except ValidationError as err:  # pragma: no cover - every field is checked above
            raise SpecError(p, f"line {n}", err.errors()[0]["msg"], "fix the row") from None
        out.append((cell["device"], row))
    if not out:
        raise SpecError(p, "line 2", "no data rows", "add one row per measured layer under the header")
    return out
