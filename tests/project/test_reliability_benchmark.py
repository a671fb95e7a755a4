"""benchmarks/reliability.py (issue 18 item 10): the report's table and totals as printed, the orphan finder,
and the corrupted-shard row on checkpoints written in this process (its only launch is the refused resume).
The rows that train (`python benchmarks/reliability.py --quick`, about 2 minutes) are run by hand."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("reliability_bench", ROOT / "benchmarks" / "reliability.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(fault: str, **kw):
    base = {"fault": fault, "ended_cleanly": True, "detect_s": 2.5, "recovered_s": None, "steps_lost": 1,
            "data_lost": False, "orphans": 0, "error": None, "note": None}
    return {**base, **kw}


def test_table_and_totals_as_printed(bench) -> None:
    rows = [_row("rank exit", error="rank 2 (stage 1, cluster 'slow') died without an error of its own"),
            _row("SIGTERM of hetauto run", detect_s=None, recovered_s=7.25, steps_lost=0, orphans=2,
                 ended_cleanly=False, data_lost=True),
            {"fault": "disk full during checkpoint", "skipped": True, "note": "skipped: mounting a tmpfs needs root"}]
    assert bench.format_table(rows) == (
        "fault                          ended cleanly detect s steps lost data lost orphans\n"
        "rank exit                                yes      2.5          1        no       0\n"
        "    rank 2 (stage 1, cluster 'slow') died without an error of its own\n"
        "SIGTERM of hetauto run                    no     7.25          0       yes       2\n"
        "disk full during checkpoint    skipped: mounting a tmpfs needs root")
    t = bench.totals(rows)
    assert t == {"faults_injected": 2, "skipped": 1, "ended_cleanly": 1, "max_detect_s": 2.5, "steps_lost": 1,
                 "data_lost": 1, "orphans": 2}
    assert bench.format_totals(t) == ("totals: 2 faults injected (1 skipped), 1 ended cleanly, max detect 2.5 s, "
                                      "1 steps lost, 1 with data lost, 2 orphans")


def test_orphans_are_found_by_the_marker_whoever_their_parent_is(bench) -> None:
    mark = uuid.uuid4().hex
    env = dict(os.environ, **{bench.MARK_ENV: mark})
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env, start_new_session=True)
    try:
        # Popen returns once exec has begun, before the kernel has set up the new image's environment: until then
        # /proc/PID/environ reads empty, so the finder is asked until the child's environment is there
        deadline = time.monotonic() + 30
        while not bench.marked(mark) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert bench.marked(mark) == [child.pid]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert bench.marked(mark) == []  # a reaped (or zombie) process is no orphan


def test_the_corrupted_shard_row_on_checkpoints_written_here(bench, tmp_path: Path) -> None:
    from hetauto.core.model_catalog import get_model
    from hetauto.runtime.checkpoint import save_checkpoint
    from hetauto.runtime.reference import make_optimizer
    from hetauto.runtime.stage import build_stage

    plan = bench._plan()
    plan.save(tmp_path / "plan.json")
    cfg = get_model(plan.model)
    stage = build_stage(cfg, (0, cfg.num_layer_slots), 0)
    opt = make_optimizer(stage.parameters(), 1e-3)
    for s in (1, 3):  # as the benchmark's job checkpoints: after steps 1 and 3
        save_checkpoint(tmp_path / "ck", s, stage, opt, plan=plan, extra={"next_step": s + 1, "seed": bench.SEED})
    row = bench.case_corrupt(tmp_path / "plan.json", 5.0, tmp_path / "ck", None)
    error = row.pop("error")
    copy = error.removeprefix("checkpoint ").split("/step-00000003 is damaged")[0]
    assert error == (f"checkpoint {copy}/step-00000003 is damaged: __0_0.distcp: sha256 differs from the manifest; "
                     f"refusing to resume from it; the previous complete checkpoint {copy}/step-00000001 verifies: "
                     f"resume with --resume {copy}/step-00000001")
    assert row.pop("detect_s") < 60
    assert row == {"fault": "corrupted shard on resume", "ended_cleanly": True, "recovered_s": None, "steps_lost": 2,
                   "data_lost": False, "orphans": 0, "latest_checkpoint": "step-00000001", "checkpoint_verified": True,
                   "resume_matches_uninterrupted": None, "note": None}
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step-00000001", "step-00000003"]  # untouched


def test_the_null_digest_row_on_checkpoints_written_here(bench, tmp_path: Path) -> None:
    """Issue 44: a manifest whose digest is null and whose seed was edited is refused before launch."""
    from hetauto.core.model_catalog import get_model
    from hetauto.runtime.checkpoint import save_checkpoint
    from hetauto.runtime.reference import make_optimizer
    from hetauto.runtime.stage import build_stage

    plan = bench._plan()
    plan.save(tmp_path / "plan.json")
    cfg = get_model(plan.model)
    stage = build_stage(cfg, (0, cfg.num_layer_slots), 0)
    opt = make_optimizer(stage.parameters(), 1e-3)
    for s in (1, 3):
        save_checkpoint(tmp_path / "ck", s, stage, opt, plan=plan, extra={"next_step": s + 1, "seed": bench.SEED})
    row = bench.case_null_digest(tmp_path / "plan.json", 5.0, tmp_path / "ck", None)
    assert row["ended_cleanly"] and not row["data_lost"] and row["orphans"] == 0, row
    assert "/step-00000003 is damaged: manifest.json: has no digest" in row["error"]
    assert row["latest_checkpoint"] == "step-00000001"
