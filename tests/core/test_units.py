from __future__ import annotations

import math

import pytest

from hetauto.core.units import (format_bandwidth, parse_bandwidth, parse_bytes, parse_flops, parse_quantity,
                                parse_time)


@pytest.mark.parametrize("text, expected", [
    ("200Gbps", 25e9), ("200 Gb/s", 25e9), ("25GB/s", 25e9), ("25GBps", 25e9), ("1.5TB/s", 1.5e12),
    ("10GiB/s", 10 * 2**30), ("100Mbps", 12.5e6), (3e9, 3e9), ("4e9", 4e9),
])
def test_bandwidth(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize("text, expected", [
    ("2ms", 2e-3), ("5us", 5e-6), ("1.5s", 1.5), ("0", 0.0), (0, 0.0), ("100ns", 1e-7), ("2min", 120.0)])
def test_time(text, expected):
    assert parse_time(text) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize("text, expected", [
    ("80GiB", 80 * 2**30), ("80GB", 80e9), ("512MiB", 512 * 2**20), ("1KiB", 1024), ("7B", 7), (1024, 1024)])
def test_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text, expected", [("312TFLOPS", 312e12), ("1.5PFLOPS", 1.5e15), ("50GFLOP/s", 50e9)])
def test_flops(text, expected):
    assert parse_flops(text) == pytest.approx(expected, rel=1e-15)


def test_unit_typo_lists_accepted_units():
    with pytest.raises(ValueError) as err:
        parse_bandwidth("200Gbsp")
    assert str(err.value) == ("unknown bandwidth unit 'Gbsp' in '200Gbsp'; accepted units: "
                              "bps, Mbps, Gbps, Tbps (bits/s), B/s, MB/s, GB/s, TB/s, GiB/s (bytes/s)")


def test_time_unit_is_not_a_bandwidth_unit():
    with pytest.raises(ValueError, match=r"unknown time unit 'Gbps' in '2Gbps'; accepted units: s, ms, us, ns"):
        parse_time("2Gbps")


@pytest.mark.parametrize("value, message", [
    ("-2ms", "time value '-2ms' must be zero or positive"),
    ("0Gbps", "bandwidth value '0Gbps' must be positive"),
    ("fast", "cannot read 'fast' as a bandwidth value"),
    (True, "expected a bandwidth value such as '200Gbps' or '25GB/s', got True"),
    ([1], "expected a bandwidth value such as '200Gbps' or '25GB/s', got list"),
    (math.inf, "is not a finite number"),
])
def test_bad_values(value, message):
    with pytest.raises(ValueError) as err:
        if value == "-2ms":
            parse_time(value)
        else:
            parse_quantity(value, "bandwidth")
    assert message in str(err.value)


def test_format_bandwidth_inverts_parse():
    assert format_bandwidth(parse_bandwidth("200Gbps")) == "200Gbps"


def test_flop_rates_keep_a_readable_prefix() -> None:
    from hetauto.core.units import format_flops_rate

    assert [format_flops_rate(f) for f in (2.744e14, 1.67e10, 3.2e15, 5e6, 12.0)] == [
        "274 TFLOP/s", "16.7 GFLOP/s", "3.2 PFLOP/s", "5 MFLOP/s", "12 FLOP/s"]
