"""`--checkpoint-dir ''` (an unset shell variable) is refused before launch (issue 44 item 5): it wrote checkpoints
into the working folder."""

from __future__ import annotations

import json
from pathlib import Path

from hetauto.cli import main
from hetauto.core.plan import Plan, StagePlan

CLUSTER = """clusters:
  - {name: a, nodes: {count: 1, devices_per_node: 1, device: cpu}}
links:
  default: {bandwidth: 1Gbps, latency: 1ms}
"""


def test_an_empty_checkpoint_dir_is_refused_in_one_line(tmp_path: Path, capsys, monkeypatch) -> None:
    (tmp_path / "one.yaml").write_text(CLUSTER)
    Plan(model="tiny-gpt", cluster="one.yaml", seq_len=16, global_batch=4, microbatch_size=2, num_microbatches=2,
         stages=(StagePlan(cluster="a", device_type="cpu", devices=(0,), layers=(0, 6), tp=1, dp=1),)
         ).save(tmp_path / "plan.json")
    monkeypatch.chdir(tmp_path)
    for empty in ("", "  "):
        assert main(["run", "plan.json", "--steps", "2", "--checkpoint-dir", empty, "--json"]) != 0
        out = capsys.readouterr()
        assert json.loads(out.out)["error"] == (
            "--checkpoint-dir is empty (an unset variable?): it would write checkpoints into the working folder; "
            "give a folder name (it is created if missing)")
        assert "Traceback" not in out.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.yaml", "plan.json"]  # nothing written here
