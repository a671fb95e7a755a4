"""A Hugging Face `datasets` folder saved to disk as training data (hetauto.runtime.hf_dataset): the same token ids
give exactly the same batches as a `.bin` token file (also across Arrow shards and the held-out split), another
column can be named, problems are one line naming the folder, and a resumed pipeline run continues on exactly
the next samples: N steps == N/2 + resume N/2, same losses and the same token ids consumed."""

from __future__ import annotations

import dataclasses

import hashlib
from pathlib import Path

import numpy as np
import pytest

# datasets (the data and dev extras install it) is imported where used: at module level every test worker paid
# ~1 s for it while collecting
from hetauto.core.errors import SpecError
from hetauto.core.model_catalog import get_model
from hetauto.core.plan import Plan, StagePlan
from hetauto.runtime.batches import BatchSource
from hetauto.runtime.token_data import open_tokens, write_tokens
from hetauto.testing.multiproc import run_ranks

SEED, GBS, MBS, SEQ, STEPS = 7, 8, 4, 16, 4


def _documents(n: int = 20, length: int = 150) -> list[list[int]]:
    text = b"the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. "
    return [list((text * 4)[i : i + length]) for i in range(n)]


def _save(folder: Path, docs: list[list[int]], column: str = "input_ids", shards: int = 1) -> Path:
    import datasets

    ds = datasets.Dataset.from_dict({column: docs, "text": [bytes(d).decode() for d in docs]})
    ds.save_to_disk(str(folder), num_shards=shards)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("hfdata")
    docs = _documents()
    return (write_tokens(root / "train.bin", docs, vocab_size=256), _save(root / "ds", docs),
            _save(root / "ds3", docs, shards=3))


def test_a_dataset_folder_gives_the_bin_files_tokens_and_batches(folders) -> None:
    bin_path, one, three = folders
    tf, ds, ds3 = open_tokens(bin_path), open_tokens(one), open_tokens(three)
    assert len(ds3.tokens.parts) == 3  # three Arrow files, read as one stream
    for other in (ds, ds3):
        assert other.num_tokens == tf.num_tokens == 3000 and other.documents == tf.documents
        np.testing.assert_array_equal(np.asarray(other.tokens), np.asarray(tf.tokens))
        for step in (0, 1, 5, -1):
            a, b = tf.batch(SEED, step, GBS, SEQ), other.batch(SEED, step, GBS, SEQ)
            assert a.tokens.equal(b.tokens) and a.targets.equal(b.targets)
    assert ds.vocab_size == max(max(d) for d in _documents()) + 1  # a datasets folder names no vocabulary
    for src in (BatchSource(SEED, 256, str(bin_path), 0.1), BatchSource(SEED, 256, str(three), 0.1)):
        assert src.held_out(0, GBS, SEQ).tokens.equal(BatchSource(SEED, 256, str(bin_path), 0.1).held_out(0, GBS, SEQ).tokens)
        assert src.train(2, GBS, SEQ).tokens.equal(BatchSource(SEED, 256, str(bin_path), 0.1).train(2, GBS, SEQ).tokens)


def test_another_column_can_be_named(tmp_path: Path, folders) -> None:
    folder = _save(tmp_path / "ids", _documents(), column="ids")
    a = BatchSource(SEED, 256, str(folder), data_column="ids").train(3, GBS, SEQ)
    assert a.tokens.equal(BatchSource(SEED, 256, str(folders[0])).train(3, GBS, SEQ).tokens)
    with pytest.raises(SpecError) as err:
        open_tokens(folder)
    assert str(err.value) == (f"{folder}: input_ids: no such column; the dataset has ids, text (name the token-id "
                              "column with --data-column)")
    with pytest.raises(SpecError) as err:
        open_tokens(folder, "text")
    assert str(err.value) == (f"{folder}: text: holds string, not lists of token ids (tokenize the text first "
                              "(Dataset.map with the tokenizer), or name the ids column)")


def test_dataset_problems_are_one_line_naming_the_folder(tmp_path: Path, folders) -> None:
    import datasets

    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"input_ids": [[1, 2]]}),
                               "test": datasets.Dataset.from_dict({"input_ids": [[3]]})})
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(SpecError) as err:
        open_tokens(tmp_path / "dd")
    assert str(err.value) == (f"{tmp_path / 'dd'}: (folder): holds a DatasetDict with splits train, test (give one "
                              f"split's folder, e.g. --data {tmp_path / 'dd' / 'train'})")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecError) as err:
        open_tokens(tmp_path / "empty")
    assert str(err.value) == (f"{tmp_path / 'empty'}: (folder): neither a token file nor a datasets folder (no "
                              "state.json) (save a tokenized dataset with Dataset.save_to_disk(FOLDER), or give a .bin)")
    with pytest.raises(SpecError) as err:
        open_tokens(folders[0], "ids")
    assert str(err.value) == (f"{folders[0]}: --data-column: picks a column of a datasets folder; train.bin is not "
                              "one (drop --data-column for a token file)")
    datasets.Dataset.from_dict({"input_ids": [[1, -2]]}).save_to_disk(str(tmp_path / "neg"))
    with pytest.raises(SpecError) as err:
        open_tokens(tmp_path / "neg")
    assert str(err.value) == (f"{tmp_path / 'neg'}: input_ids: holds the negative id -2 (token ids are 0 .. "
                              "vocab_size - 1)")
    empty = datasets.Dataset.from_dict({"input_ids": [[1]]}).select([])  # 0 rows (issue 30)
    empty.save_to_disk(str(tmp_path / "empty"))
    with pytest.raises(SpecError) as err:
        open_tokens(tmp_path / "empty")
    assert str(err.value) == (f"{tmp_path / 'empty'}: input_ids: holds no token ids (0 rows) (tokenize some text "
                              "into it first)")
    with pytest.raises(SpecError) as err:
        open_tokens(folders[1]).check_fits(40, 99, 256)
    assert str(err.value).startswith(f"{folders[1]}: tokens: 3000 tokens are fewer than one step needs")


def _work(rank: int, world: int, plan_json: str, data: str, root: str) -> dict:
    """Three runs in one set of ranks: the whole run, its first half (checkpointed), the rest resumed from it."""
    from hetauto.core.comm import Communicator
    from hetauto.core.run_config import CheckpointConfig, RunConfig
    from hetauto.runtime import batches
    from hetauto.runtime.training import train_rank

    consumed: list[list] = []
    train = batches.BatchSource.train

    def recording(self, step, global_batch, seq_len):  # type: ignore[no-untyped-def]
        batch = train(self, step, global_batch, seq_len)
        consumed.append([step, hashlib.sha256(batch.tokens.numpy().tobytes()).hexdigest()])
        return batch

    batches.BatchSource.train = recording  # type: ignore[method-assign]
    comm = Communicator.init_from_env("gloo", timeout_s=30)

    def run(steps: int, checkpoints: CheckpointConfig) -> dict:
        consumed.clear()
        report = train_rank(comm, Plan.from_json(plan_json), get_model("tiny-gpt"),
                            dataclasses.replace(RunConfig.from_flat(steps=steps, seed=SEED, timeout_s=30, data=data),
                                    checkpoint=checkpoints)).to_dict()
        return {**report, "consumed": list(consumed)}

    try:
        return {"whole": run(STEPS, CheckpointConfig()),
                "half": run(STEPS // 2, CheckpointConfig(dir=f"{root}/b", every=STEPS // 2)),
                "rest": run(STEPS, CheckpointConfig(resume=f"{root}/b"))}
    finally:
        comm.destroy()


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_a_resumed_run_continues_on_exactly_the_next_samples(tmp_path: Path, folders) -> None:
    from hetauto.job.results import summarize

    stages = (StagePlan(cluster="fast", device_type="cpu", devices=(0,), layers=(0, 3), tp=1, dp=1),
              StagePlan(cluster="fast", device_type="cpu", devices=(1,), layers=(3, 6), tp=1, dp=1))
    plan = Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=SEQ, global_batch=GBS, microbatch_size=MBS,
                num_microbatches=GBS // MBS, stages=stages)
    ranks = run_ranks(_work, 2, plan.to_json(), str(folders[2]), str(tmp_path), timeout=200)
    whole, half, rest = ([r[phase] for r in ranks] for phase in ("whole", "half", "rest"))
    assert rest[0]["start_step"] == STEPS // 2
    assert list(summarize(plan, half).losses) + list(summarize(plan, rest).losses) == list(summarize(plan, whole).losses)
    for r in range(2):  # both the first stage (tokens) and the last (targets) read the same samples
        assert [s for s, _ in whole[r]["consumed"]] == list(range(STEPS))
        assert half[r]["consumed"] + rest[r]["consumed"] == whole[r]["consumed"]
