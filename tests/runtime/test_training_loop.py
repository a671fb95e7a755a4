"""The training loop people expect, across a pipeline: real tokens from a local token file, a warm-up + cosine
learning-rate schedule and gradient clipping by the global norm (summed over every stage, TP shard and DP
replica once), equal to the single-process reference; and the token file's format and errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hetauto.core.errors import SpecError
from hetauto.core.model_catalog import get_model
from hetauto.core.plan import Plan, StagePlan
from hetauto.core.run_config import DataConfig, TrainingConfig
from hetauto.job.results import summarize
from hetauto.runtime.optim import LRSchedule, clip_coefficient
from hetauto.runtime.reference import BatchShape, reference_run
from hetauto.runtime.token_data import TOKENS_FORMAT, open_tokens, write_tokens
from hetauto.testing.multiproc import run_ranks

GPT = get_model("tiny-gpt")
TIED = dataclasses.replace(GPT, name="tiny-gpt-tied", tie_embeddings=True)
STEPS, SEED = 4, 11
CLIP = 0.05  # below the tiny models' gradient norms: clipping acts on every step
TRAINING = TrainingConfig(steps=STEPS, seed=SEED, timeout_s=30, lr=3e-3, lr_schedule="cosine", warmup_steps=2,
                          min_lr=3e-4, clip_grad=CLIP)
SCHEDULE = LRSchedule.of(TRAINING)  # lr 3e-3, cosine, warm-up 2, decaying over the run's 4 steps to 3e-4


def _data(path: str | None) -> DataConfig:
    return DataConfig(path=path, eval_every=2, eval_steps=2, eval_fraction=0.2)


def _documents(n: int = 20, length: int = 150) -> list[np.ndarray]:
    """Byte-level text (tiny-gpt's vocabulary is the 256 byte values): learnable, so the loss falls."""
    text = b"the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. "
    return [np.frombuffer((text * 4)[i : i + length], dtype=np.uint8).astype(np.int64) for i in range(n)]


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> Path:
    return write_tokens(tmp_path_factory.mktemp("data") / "train.bin", _documents(), vocab_size=256)


# -- the schedule and the clip coefficient, closed form -------------------------------------------------
def test_warmup_then_cosine_to_min_lr() -> None:
    lrs = [SCHEDULE.lr_at(s) for s in range(6)]
    assert lrs[:2] == [1.5e-3, 3e-3]  # linear warm-up: lr * (step + 1) / warmup
    assert lrs[2] == pytest.approx(3e-3)  # cosine starts at lr ...
    assert lrs[3] == pytest.approx(3e-4 + 0.5 * 2.7e-3)  # ... is halfway at the middle of the decay ...
    assert lrs[4] == lrs[5] == pytest.approx(3e-4)  # ... and stays at min_lr after decay_steps
    assert LRSchedule(lr=1.0, kind="linear", decay_steps=4).lr_at(1) == 0.75
    assert LRSchedule(lr=2e-3).lr_at(100) == 2e-3


def test_clip_coefficient_is_torchs() -> None:
    assert clip_coefficient(2.0, 1.0) == 1.0 / (2.0 + 1e-6)
    assert clip_coefficient(0.5, 1.0) == 1.0


@pytest.mark.parametrize("kwargs, message", [
    (dict(lr=0.0), "--lr must be > 0, got 0.0"),
    (dict(warmup_steps=-1), "--warmup-steps must be >= 0, got -1"),
    (dict(lr=1e-3, min_lr=1e-2), "--min-lr must be between 0 and --lr (0.001), got 0.01"),
])
def test_bad_schedules_say_which_flag(kwargs, message) -> None:
    with pytest.raises(ValueError) as err:
        LRSchedule(**kwargs)
    assert str(err.value) == message


# -- the token file -------------------------------------------------------------------------------------
def test_a_token_file_round_trips_with_its_sidecar(tokens: Path) -> None:
    tf = open_tokens(tokens)
    assert (tf.vocab_size, tf.num_tokens, tf.documents[:3]) == (256, 3000, (0, 150, 300))
    assert tf.tokens.dtype == np.uint16
    np.testing.assert_array_equal(np.asarray(tf.tokens[150:300]), _documents()[1])  # document 1, in order
    meta = json.loads(tokens.with_suffix(".json").read_text())
    assert meta["format"] == TOKENS_FORMAT and meta["tokens"] == 3000


def test_a_steps_batch_is_windows_of_the_file_and_a_function_of_seed_and_step(tokens: Path) -> None:
    tf = open_tokens(tokens)
    a, b = tf.batch(SEED, 3, 8, 16), tf.batch(SEED, 3, 8, 16)
    assert a.tokens.equal(b.tokens) and a.targets.equal(b.targets)  # a resumed run sees the same samples
    assert not a.tokens.equal(tf.batch(SEED, 4, 8, 16).tokens)
    flat = np.asarray(tf.tokens, dtype=np.int64)
    for row, tgt in zip(a.tokens.numpy(), a.targets.numpy()):
        start = next(i for i in range(len(flat) - 16) if (flat[i : i + 16] == row).all())
        assert (flat[start + 1 : start + 17] == tgt).all()  # targets are the next tokens


def test_token_file_problems_are_one_line_naming_the_file(tmp_path: Path, tokens: Path) -> None:
    with pytest.raises(SpecError) as err:
        open_tokens(tmp_path / "none.bin")
    assert str(err.value) == (f"{tmp_path / 'none.bin'}: (file): no such token file (make one with "
                              "`hetauto data prepare TEXT... -o FILE.bin`)")
    cut = tmp_path / "cut.bin"
    cut.write_bytes(tokens.read_bytes()[:-1])
    cut.with_suffix(".json").write_text(tokens.with_suffix(".json").read_text())
    with pytest.raises(SpecError) as err:
        open_tokens(cut)
    assert str(err.value) == f"{cut}: (file): 5999 bytes is not a whole number of uint16 tokens (truncated?)"
    with pytest.raises(SpecError) as err:
        open_tokens(tokens).check_fits(global_batch=200, seq_len=16, model_vocab=256)
    assert str(err.value) == (f"{tokens}: tokens: 3000 tokens are fewer than one step needs (200 samples x 17 tokens "
                              "= 3400) (prepare more text, or lower the plan's global_batch or seq_len)")
    with pytest.raises(SpecError) as err:
        open_tokens(tokens).check_fits(global_batch=8, seq_len=16, model_vocab=128, model="tiny")
    assert str(err.value) == (f"{tokens}: vocab_size: the data's vocabulary of 256 ids does not fit tiny's 128 "
                              "(tokenize with the model's own tokenizer)")


# -- the loop across a pipeline, against one process ---------------------------------------------------------
def _plan(model: str) -> Plan:
    def stage(cluster, layers, tp, dp):
        return StagePlan(cluster=cluster, device_type="cpu", devices=tuple(range(tp * dp)), layers=layers, tp=tp, dp=dp)

    return Plan(model=model, cluster="cpu-demo", seq_len=16, global_batch=8, microbatch_size=4, num_microbatches=2,
                stages=(stage("fast", (0, 3), 2, 1), stage("slow", (3, 5), 1, 2), stage("fast", (5, 6), 1, 1)))


def _work(rank: int, world: int, cases: list) -> list[dict]:
    from hetauto.core.comm import Communicator
    from hetauto.core.run_config import EmulationConfig, RunConfig
    from hetauto.runtime.executor import run_rank

    comm = Communicator.init_from_env("gloo", timeout_s=30)
    try:
        out = []
        for tied, data in cases:
            opts = RunConfig(training=TRAINING, data=_data(data),
                             emulation=EmulationConfig(backends=("cpu", "mock", "cpu")))
            out.append(run_rank(comm, _plan("tiny-gpt"), TIED if tied else GPT, opts).to_dict())
        return out
    finally:
        comm.destroy()


@pytest.mark.multiprocess
def test_schedule_clipping_and_real_tokens_match_the_single_process_reference(tokens: Path) -> None:
    cases = [(False, str(tokens)), (True, None)]  # real tokens; the synthetic stream with a tied table
    per_rank = run_ranks(_work, 5, cases, timeout=200)
    for c, (tied, data) in enumerate(cases):
        reports = [per_rank[r][c] for r in range(5)]
        got = summarize(_plan("tiny-gpt"), reports).losses
        ref = reference_run(TIED if tied else GPT, BatchShape(8, 4, 16), TRAINING, _data(data))
        want = ref.losses
        assert max(abs(a - b) for a, b in zip(got, want)) < 1e-5, (tied, got, want)
        # the held-out loss after steps 1 and 3 (every 2 steps, and the last), summed over the last stage's shares
        held = [[e[0], sum(r["eval_losses"][i][1] for r in reports if r["eval_losses"])]
                for i, e in enumerate(reports[4]["eval_losses"])]
        assert [s for s, _ in held] == [s for s, _ in ref.eval_losses] == [1, 3]
        assert max(abs(a[1] - b[1]) for a, b in zip(held, ref.eval_losses)) < 1e-5
        assert held[1][1] < held[0][1]
        assert got[-1] < got[0]
        norms = {tuple(round(n, 9) for n in r["grad_norms"]) for r in reports}
        assert len(norms) == 1 and all(n > CLIP for n in next(iter(norms)))  # one global norm, clipping acted
        assert {tuple(r["lrs"]) for r in reports} == {tuple(SCHEDULE.lr_at(s) for s in range(STEPS))}


# -- the commands ---------------------------------------------------------------------------------------
def test_data_prepare_writes_a_token_file_of_the_texts_bytes(tmp_path: Path, capsys) -> None:
    from hetauto.cli import main

    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes(b"hello")
    b.write_bytes(b"\x00\xffok")
    out = tmp_path / "train.bin"
    assert main(["data", "prepare", str(a), str(b), "-o", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"output": str(out), "sidecar": str(out.with_suffix(".json")),
                                                   "documents": 2, "tokens": 9, "vocab_size": 256,
                                                   "tokenizer": "bytes"}
    tf = open_tokens(out)
    assert list(np.asarray(tf.tokens)) == list(b"hello") + [0, 255] + list(b"ok") and tf.documents == (0, 5)
    assert main(["data", "prepare", str(a), "-o", str(tmp_path / "x.bin"), "--tokenizer", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (f"hetauto data: error: --tokenizer {tmp_path}: no tokenizer.json "
                                               "there; give a folder holding a Hugging Face tokenizer.json, or 'bytes'")


def test_data_prepare_never_overwrites_what_it_did_not_write(tmp_path: Path, capsys) -> None:
    from hetauto.cli import main

    text = tmp_path / "small.txt"
    text.write_text("precious")
    (tmp_path / "notes.json").write_text("{}")
    (tmp_path / "dir").mkdir()
    cases = {
        str(text): f"-o {text}: the token file would overwrite the input {text}; choose another -o, such as "
                   f"{tmp_path / 'small-tokens.bin'}",
        str(tmp_path / "small.bin"): f"-o {tmp_path / 'small.bin'}: its sidecar would overwrite the input "
                                     f"{tmp_path / 'small.json'}; choose another -o, such as "
                                     f"{tmp_path / 'small-tokens.bin'}",
        str(tmp_path / "dir"): f"-o {tmp_path / 'dir'}: is a folder; give a file name such as "
                               f"{tmp_path / 'dir' / 'tokens.bin'}",
        str(tmp_path / "notes.bin"): f"-o {tmp_path / 'notes.bin'}: {tmp_path / 'notes.json'} exists and is not a "
                                     "token file written by hetauto data prepare; remove it or choose another -o "
                                     "(nothing is overwritten)",
    }
    (tmp_path / "small.json").write_text("also precious")
    for out, message in cases.items():
        args = ["data", "prepare", str(text), str(tmp_path / "small.json"), "-o", out]
        assert main(args) == 2, out
        assert capsys.readouterr().err.strip() == f"hetauto data: error: {message}"
    assert text.read_text() == "precious" and (tmp_path / "notes.json").read_text() == "{}"
    out = tmp_path / "t.bin"
    assert main(["data", "prepare", str(text), "-o", str(out)]) == 0
    assert main(["data", "prepare", str(text), "-o", str(out)]) == 0  # its own output may be written again


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_hetauto_run_trains_on_a_token_file_with_a_schedule_and_clipping(tmp_path: Path, tokens: Path,
                                                                        capsys) -> None:
    from hetauto.cli import main

    plan = _plan("tiny-gpt").model_copy(update={"stages": (
        StagePlan(cluster="fast", device_type="cpu", devices=(0,), layers=(0, 3), tp=1, dp=1),
        StagePlan(cluster="slow", device_type="cpu", devices=(0,), layers=(3, 6), tp=1, dp=1))})
    plan.save(tmp_path / "plan.json")
    # in this process (the launch, torchrun and its ranks are real; a hetauto subprocess would import torch again)
    code = main(["run", str(tmp_path / "plan.json"), "--steps", "3", "--emulate", "--json", "--data", str(tokens),
                 "--lr", "3e-3", "--lr-schedule", "linear", "--warmup-steps", "1", "--clip-grad", str(CLIP),
                 "--log-jsonl", str(tmp_path / "log.jsonl"), "--eval-every", "2", "--tensorboard", str(tmp_path / "tb"),
                 "--weight-decay", "0.1"])
    out = capsys.readouterr()
    assert code == 0, out.err[-2000:]
    doc = json.loads(out.out)
    assert doc["max_loss_diff"] < 1e-5 and doc["data"] == str(tokens)
    assert doc["lr"] == [LRSchedule(lr=3e-3, kind="linear", warmup_steps=1, decay_steps=3).lr_at(s) for s in range(3)]
    assert len(doc["grad_norm"]) == 3 and min(doc["grad_norm"]) > CLIP
    lines = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [0, 1, 2]  # written while the run went on, one line per step
    assert [r["loss"] for r in lines] == doc["loss"] and [r["lr"] for r in lines] == doc["lr"]
    assert [r["grad_norm"] for r in lines] == doc["grad_norm"] and all(r["tokens_s"] > 0 for r in lines)
    assert [e[0] for e in doc["eval_loss"]] == [e[0] for e in doc["reference_eval_loss"]] == [1, 2]
    assert max(abs(a[1] - b[1]) for a, b in zip(doc["eval_loss"], doc["reference_eval_loss"])) < 1e-5
    assert [r["eval_loss"] for r in lines] == [None, doc["eval_loss"][0][1], doc["eval_loss"][1][1]]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(tmp_path / "tb"))
    board.Reload()
    assert [(e.step, round(e.value, 5)) for e in board.Scalars("train/loss")] == [
        (i, round(v, 5)) for i, v in enumerate(doc["loss"])]
    assert [e.step for e in board.Scalars("eval/loss")] == [1, 2]
    from hetauto.job.predict import flops_per_peak as _flops_per_peak

    per_peak = _flops_per_peak(plan)  # MFU: the step's model FLOPs over the plan's peak in its step time
    assert [r["mfu"] for r in lines] == [per_peak / r["step_s"] for r in lines]
    assert [e.step for e in board.Scalars("train/mfu")] == [0, 1, 2] and len(doc["mfu"]) == 3


def test_the_step_log_joins_the_last_stages_replicas_once_each_has_written_the_step(tmp_path: Path) -> None:
    from hetauto.runtime.step_log import StepLog, log_ranks, rank_log_name

    plan = _plan("tiny-gpt")  # tp 2 | dp 2 | 1: the last stage is rank 4 alone
    two = plan.model_copy(update={"stages": (plan.stages[0], plan.stages[1].model_copy(update={"layers": (3, 6)}))})
    assert log_ranks(two) == (2, 3) and log_ranks(plan) == (4,)  # a dp 2 last stage: both replicas' shares
    seen = []
    log = StepLog(two, tmp_path, tmp_path / "out.jsonl", seen.append)
    append_step(tmp_path / rank_log_name(2), 0, 1.5, 1e-3, None, 0.2)
    assert log.poll() == []  # rank 3's share of step 0 is not there yet
    with open(tmp_path / rank_log_name(3), "w") as fh:
        fh.write('{"step": 0, "loss": 1.25, "lr": 0.001, "grad_norm": null, "step_s": 0.25}\n{"step": 1, "lo')
    (rec,) = log.poll()  # a half-written line waits for the next poll
    assert (rec.step, rec.loss, rec.step_s, rec.tokens_s) == (0, 2.75, 0.25, 8 * 16 / 0.25)
    assert seen == [rec] and json.loads((tmp_path / "out.jsonl").read_text())["loss"] == 2.75


def test_a_steps_mfu_is_its_model_flops_over_the_plans_peak_in_its_step_time(tmp_path: Path) -> None:
    from hetauto.job.predict import flops_per_peak as _flops_per_peak
    from hetauto.planner.evaluate import evaluate_plan
    from hetauto.planner.layers import model_flops_per_token
    from hetauto.runtime.step_log import StepLog, rank_log_name

    plan = Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=16, global_batch=8, microbatch_size=4,
                num_microbatches=2, stages=(StagePlan(cluster="fast", device_type="cpu", devices=(0,), layers=(0, 3), tp=1, dp=1),
                                            StagePlan(cluster="slow", device_type="cpu", devices=(0,), layers=(3, 6), tp=1,
                                                      dp=1)))
    # cpu-demo: fast 1 TFLOP/s, slow 1 TFLOP/s at speed factor 0.5, one device each; fp32 (its peak is the figure)
    flops = model_flops_per_token(GPT, 16) * 8 * 16
    assert _flops_per_peak(plan) == pytest.approx(flops / 1.5e12, rel=1e-12)
    assert evaluate_plan(plan).mfu == pytest.approx(_flops_per_peak(plan) / evaluate_plan(plan).iteration_time_s)
    log = StepLog(plan, tmp_path, tmp_path / "out.jsonl", flops_per_peak=flops / 1.5e12)
    append_step(tmp_path / rank_log_name(1), 0, 1.5, 1e-3, None, 0.5)
    (rec,) = log.poll()
    assert rec.mfu == pytest.approx(flops / 1.5e12 / 0.5, rel=1e-12)
    assert json.loads((tmp_path / "out.jsonl").read_text())["mfu"] == rec.mfu
    assert StepLog(plan, tmp_path).flops_per_peak is None  # no figure given: no MFU claimed


def append_step(path: Path, *fields: Any) -> None:
    """A rank's step line as the lead's control mirror appends it to the run folder (hetauto.launch.control)."""
    from hetauto.runtime.step_log import step_line

    with open(path, "a", encoding="utf-8") as fh:
        fh.write(step_line(*fields) + "\n")
