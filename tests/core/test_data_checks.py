"""Data checks before launch (issue 30): a token id beyond the model's vocabulary in a `.bin` whose sidecar claims
it fits is refused before any rank starts, naming the file, the id and where it is (also when it lies only in the
held-out tail, which training would reach only at the first evaluation)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hetauto.core.errors import SpecError
from hetauto.core.plan import Plan, StagePlan
from hetauto.runtime.token_data import open_tokens, write_tokens

CLUSTER = """clusters:
  - {name: a, nodes: {count: 1, devices_per_node: 1, device: cpu}}
links:
  default: {bandwidth: 1Gbps, latency: 1ms}
"""


def _bad_bin(folder: Path, at: int, bad: int = 300, n: int = 4000) -> Path:
    """A token file of n ids < 256 whose sidecar says vocab 256, with id `bad` written at position `at`."""
    path = write_tokens(folder / f"bad{at}.bin", [np.arange(n, dtype=np.int64) % 256], 256)
    arr = np.memmap(path, dtype=np.uint16, mode="r+")
    arr[at] = bad
    arr.flush()
    return path


def test_an_id_beyond_the_vocabulary_is_named_with_its_position(tmp_path: Path) -> None:
    path = _bad_bin(tmp_path, 1234)
    with pytest.raises(SpecError) as err:
        open_tokens(path).check_fits(global_batch=4, seq_len=16, model_vocab=256, model="tiny-gpt")
    assert str(err.value) == (f"{path}: tokens: token id 300 at position 1234 is outside tiny-gpt's vocabulary of 256 "
                              "ids (0..255) (tokenize with the model's own tokenizer, or fix the file)")
    open_tokens(path).check_fits(global_batch=4, seq_len=16, model_vocab=301)  # a model it fits


def test_hetauto_run_refuses_it_before_launch_even_in_the_held_out_tail(tmp_path: Path, capsys) -> None:
    from hetauto.cli import main

    (tmp_path / "one.yaml").write_text(CLUSTER)
    Plan(model="tiny-gpt", cluster="one.yaml", seq_len=16, global_batch=4, microbatch_size=2, num_microbatches=2,
         stages=(StagePlan(cluster="a", device_type="cpu", devices=(0,), layers=(0, 6), tp=1, dp=1),)
         ).save(tmp_path / "plan.json")
    path = _bad_bin(tmp_path, 3990)  # inside the last 5% (--eval-fraction's default)
    assert main(["run", str(tmp_path / "plan.json"), "--data", str(path), "--eval-every", "2", "--json"]) == 2
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    assert json.loads(out.out)["error"] == (
        f"{path}: tokens: token id 300 at position 3990 is outside tiny-gpt's vocabulary of 256 ids (0..255) "
        "(tokenize with the model's own tokenizer, or fix the file)")
