"""Parsing explicit unit strings (`"200Gbps"`, `"25GB/s"`, `"2ms"`, `"80GiB"`, `"312TFLOPS"`) into SI floats.

Specs carry units as text so that a reader never guesses whether `200` meant Gb/s or GB/s (a cluster spec's
links must say: `require_unit`, so `bandwidth: 200` is an error, not 200 B/s). Every parser
returns an SI float (bytes/s, seconds, bytes, FLOP/s) and raises `ValueError` listing the accepted units
on a typo; loaders turn that into a `SpecError` naming the file and field.
"""

from __future__ import annotations

import math
import re

_NUMBER = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z/]*)\s*$")

_DEC = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BIN = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}


def _table_bytes() -> dict[str, float]:
    out = {"B": 1.0}
    for p, f in _DEC.items():
        if p:
            out[f"{p}B"] = f
    for p, f in _BIN.items():
        out[f"{p}B"] = f
    return out


def _table_bandwidth() -> dict[str, float]:
    out: dict[str, float] = {}
    for p, f in list(_DEC.items()) + list(_BIN.items()):
        if p == "K":
            continue
        out[f"{p}B/s"] = f
        if p not in _BIN:  # bits come with decimal prefixes only: a 'Gibps' is nobody's datasheet unit, so a typo
            out[f"{p}bps"] = f / 8.0
            out[f"{p}b/s"] = f / 8.0
        if p:
            out[f"{p}Bps"] = f
    return out


def _table_time() -> dict[str, float]:
    return {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0}


def _table_flops() -> dict[str, float]:
    out: dict[str, float] = {}
    for p, f in _DEC.items():
        if p == "K":
            continue
        out[f"{p}FLOPS"] = f
        out[f"{p}FLOP/s"] = f
    return out


BYTES_UNITS = _table_bytes()
BANDWIDTH_UNITS = _table_bandwidth()
TIME_UNITS = _table_time()
FLOPS_UNITS = _table_flops()

_KINDS: dict[str, tuple[dict[str, float], str]] = {
    "bytes": (BYTES_UNITS, "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"),
    "bandwidth": (BANDWIDTH_UNITS, "bps, Mbps, Gbps, Tbps (bits/s), B/s, MB/s, GB/s, TB/s, GiB/s (bytes/s)"),
    "time": (TIME_UNITS, "s, ms, us, ns"),
    "flops": (FLOPS_UNITS, "FLOPS, GFLOPS, TFLOPS, PFLOPS (or FLOP/s forms)"),
}


# Why bounds: 1e300Gbps parsed to infinity once multiplied (shown as infGbps) and 1e-300Gbps planned a link that
# would take longer than the universe; neither is a typo anyone means. The range holds every real figure: a
# 1 kbit/s emulated link up to 1 PB/s (above any memory bandwidth), up to 1 EiB, up to 1 ZFLOP/s per device.
BOUNDS: dict[str, tuple[float, float, str, str]] = {
    "bandwidth": (125.0, 1e15, "1kbps", "1PB/s"),
    "bytes": (0.0, float(2**60), "0B", "1EiB"),
    "flops": (0.0, 1e21, "0FLOPS", "1000EFLOPS"),
}


def parse_quantity(value: object, kind: str, *, allow_zero: bool = False, require_unit: bool = False) -> float:
    """Parse `value` (a unit string, or a plain number already in SI units) as a quantity of `kind`
    ("bytes", "bandwidth", "time" or "flops"). Negative, NaN and infinite values are rejected; zero
    only when `allow_zero` (a latency may be 0, a bandwidth may not). With `require_unit` a number without a
    unit (`200`, `"2"`) is rejected, saying what to write, rather than guessed to be SI; zero needs none."""
    table, accepted = _KINDS[kind]
    if isinstance(value, bool):
        raise ValueError(f"expected a {kind} value such as {_example(kind)}, got {value!r}")
    if isinstance(value, (int, float)):
        number = float(value)
        if require_unit and number != 0 and not math.isnan(number):
            raise ValueError(_no_unit(value, kind))
    elif isinstance(value, str):
        m = _NUMBER.match(value)
        if not m:
            raise ValueError(f"cannot read {value!r} as a {kind} value; write a number and a unit ({accepted})")
        unit = m.group(2)
        if unit == "":
            if require_unit and float(m.group(1)) != 0:
                raise ValueError(_no_unit(m.group(1), kind))
            factor = 1.0
        elif unit in table:
            factor = table[unit]
        else:
            raise ValueError(f"unknown {kind} unit {unit!r} in {value!r}; accepted units: {accepted}")
        number = float(m.group(1)) * factor
    else:
        raise ValueError(f"expected a {kind} value such as {_example(kind)}, got {type(value).__name__}")
    if math.isnan(number) or math.isinf(number):
        raise ValueError(f"{kind} value {value!r} is not a finite number")
    if number < 0 or (number == 0 and not allow_zero):
        need = "zero or positive" if allow_zero else "positive"
        raise ValueError(f"{kind} value {value!r} must be {need}")
    if kind in BOUNDS and number != 0:
        low, high, low_text, high_text = BOUNDS[kind]
        if not low <= number <= high:
            raise ValueError(f"{kind} value {value!r} is outside {low_text}..{high_text}, the range of real "
                             "hardware; check the exponent and the unit")
    return number


def _no_unit(value: object, kind: str) -> str:
    n = value if isinstance(value, str) else f"{value:g}"
    write = {"bandwidth": f"'{n}Gbps' (bits/s) or '{n}GB/s' (bytes/s)", "time": f"'{n}ms' or '{n}s'",
             "bytes": f"'{n}GB' or '{n}GiB'", "flops": f"'{n}TFLOPS'"}[kind]
    return f"{n} has no unit; write {write}"


def _example(kind: str) -> str:
    return {"bytes": "'80GiB'", "bandwidth": "'200Gbps' or '25GB/s'", "time": "'2ms'", "flops": "'312TFLOPS'"}[kind]


def parse_bytes(value: object) -> float:
    return parse_quantity(value, "bytes")


def parse_bandwidth(value: object, *, require_unit: bool = False) -> float:
    """Bytes per second. `Gbps`/`Gb/s` are bits (÷8); `GB/s`/`GBps` are bytes."""
    return parse_quantity(value, "bandwidth", require_unit=require_unit)


def parse_time(value: object, *, require_unit: bool = False) -> float:
    """Seconds; zero allowed (an idealised link)."""
    return parse_quantity(value, "time", allow_zero=True, require_unit=require_unit)


def parse_flops(value: object) -> float:
    return parse_quantity(value, "flops")


def format_bytes(n: float) -> str:
    for unit, f in (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if n >= f:
            return f"{n / f:.3g}{unit}"
    return f"{n:.0f}B"


def format_bandwidth(bps: float) -> str:
    """Bytes/s rendered as Gbps (the unit network people think in)."""
    return f"{bps * 8 / 1e9:.4g}Gbps"


def format_flops(f: float) -> str:
    return f"{f / 1e12:.4g}TFLOPS"


def format_flops_rate(f: float) -> str:
    """FLOP/s with a prefix that keeps a small rate readable (a CPU's 40 GFLOP/s is not '0.0 TFLOP/s')."""
    for unit, scale in (("PFLOP/s", 1e15), ("TFLOP/s", 1e12), ("GFLOP/s", 1e9), ("MFLOP/s", 1e6)):
        if f >= scale:
            return f"{f / scale:.3g} {unit}"
    return f"{f:.3g} FLOP/s"


def format_time(s: float) -> str:
    if s >= 1:
        return f"{s:.4g}s"
    if s >= 1e-3:
        return f"{s * 1e3:.4g}ms"
    return f"{s * 1e6:.4g}us"
