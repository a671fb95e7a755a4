"""benchmarks/operations.py (issue 41's figures): every attack of its catalogue is refused by a control store with
the job's token (served in this process, the job's own bounds), and a client with the token is still served after
them; the RSS slope and the report's lines as printed. The rows that train (`python benchmarks/operations.py`,
about 2 minutes) are run by hand."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from hetauto.core.control_store import ControlStoreClient
from hetauto.launch.control import ControlServer
from hetauto.launch.node_end import ABORT_KEY
from hetauto.runtime.control import SEQ_KEY

ROOT = Path(__file__).resolve().parents[2]
SECRET = "ab" * 32


@pytest.fixture(scope="module")
def ops():
    spec = importlib.util.spec_from_file_location("operations_bench", ROOT / "benchmarks" / "operations.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_attack_of_the_catalogue_is_refused_and_changes_nothing(ops, tmp_path: Path) -> None:
    with ControlServer(tmp_path / "run", token=SECRET) as control:
        rows = [ops._attempt(a, "now") for a in ops.attack_catalogue(control.port, SECRET, flood=50)]
        assert [r["attack"] for r in rows if not r["refused"]] == [], rows
        assert len(rows) == 12
        assert control.get(ABORT_KEY) is None and int(control.store.add(SEQ_KEY, 0)) == 0
        assert not any(key.startswith("hetauto/node/") for key in control.store._values)
        assert ControlStoreClient("127.0.0.1", control.port, timeout_s=5, token=SECRET).add("x", 1) == 1


def test_the_rss_slope_is_per_step_past_the_warm_up(ops) -> None:
    samples = [(0, 100_000)] * 5 + [(n, 200_000 + 3 * n) for n in range(0, 101, 5)]  # 3 KiB a step after warm-up
    fit = ops.slope_per_step(samples, steps=100)
    assert fit["kib_per_step"] == pytest.approx(3.0) and fit["rss_kib_first_last"] == [200_060, 200_285]
    assert fit["steps_first_last"] == [20, 95]
    assert ops.slope_per_step(samples[:8], 100)["kib_per_step"] is None


def test_the_report_says_tried_refused_and_the_ratios(ops) -> None:
    doc = {"attacks": {"rows": [{"attack": "set abort", "when": "while training", "refused": True,
                                 "how": "closed before any answer"}], "tried": 1, "refused": 1, "trained_on": True,
                       "steps_trained": 30, "steps": 30, "exit_codes": [0, 0], "lead_refusal_lines": 1,
                       "lead_rss_mib": [38.0, 39.0]},
           "auth": {"job": {"on_step_s": 0.05, "off_step_s": 0.05, "ratio": 1.0},
                    "plane": {"on_message_s": 1e-4, "off_message_s": 1e-4, "message_ratio": 1.0, "on_connect_s": 2e-3,
                              "off_connect_s": 1e-3}, "plane_ratio": 1.0}}
    assert ops.format_report(doc).splitlines() == [
        "Attacks on the lead's control port (a real two-site job on this host):",
        "  refused     while training  set abort: closed before any answer",
        "  tried 1, refused 1 (100%); the job trained on: True (30/30 steps, exits [0, 0]); the lead said 1 refusal "
        "line(s); lead RSS 38 -> 39 MiB",
        "Authentication's cost per step (on / off, side by side):",
        "  real 2-rank jobs: median step 50.00 / 50.00 ms, ratio 1.000 (runs alternate; noise of a shared host "
        "included)",
        "  control plane: 100.0 / 100.0 us a message (ratio 1.000); connect 2.00 / 1.00 ms (the challenge, once per "
        "connection); a step with its 2 messages: ratio 1.0000"]
