"""A lost island drops out of the outer sync and the others train on without a restart (issue 41 item 6, islands;
hetauto.runtime.island_members), through the real job path: three 1-rank islands of tiny-gpt on this host
(`hetauto run ISLAND_PLAN.json`), one killed by --inject-fault.

What must hold: the survivors finish every step and agree bit for bit; their losses and final parameters are the
single-process island reference's with the same membership schedule (hetauto.runtime.island_reference `lost`:
every outer step after the loss merges the survivors alone, their token weights renormalised); the lost island is
named once, with the step its peers dropped it at; and a lost store (island 0 serves it) is one named line, well
within the timeout, instead of a hang.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from hetauto.core.islands import Island, IslandPlan, OuterSync, WireLink
from hetauto.core.plan import Plan, StagePlan

STEPS, H, LOST_AT, TIMEOUT = 6, 2, 3, 20
NAMES = ("A", "B", "C")
CLUSTERS = """clusters:
  - {name: a, nodes: {count: 1, devices_per_node: 1, device: cpu}, speed_factor: 1.0}
  - {name: b, nodes: {count: 1, devices_per_node: 1, device: cpu}, speed_factor: 1.0}
  - {name: c, nodes: {count: 1, devices_per_node: 1, device: cpu}, speed_factor: 1.0}
links:
  default: {bandwidth: 1Gbps, latency: 1ms}
"""


def _island(cluster: str, batch: int) -> Island:
    stage = StagePlan(cluster=cluster, device_type="cpu", devices=(0,), layers=(0, 6), tp=1, dp=1)
    return Island(name=cluster.upper(), plan=Plan(model="tiny-gpt", cluster="c.yaml", seq_len=16, global_batch=batch,
                                                  microbatch_size=2, num_microbatches=batch // 2, stages=(stage,)))


def three_islands(tmp_path: Path, inner_steps: int = H, latency: str = "1ms") -> Path:
    """Three 1-rank islands (rows 2, 4, 2 of each batch of 8); H=2 by default: syncs after steps 1, 3, 5."""
    (tmp_path / "c.yaml").write_text(CLUSTERS.replace("latency: 1ms", f"latency: {latency}"))
    plan = IslandPlan(model="tiny-gpt", cluster="c.yaml", seq_len=16, global_batch=8,
                      islands=(_island("a", 2), _island("b", 4), _island("c", 2)),
                      outer=OuterSync(inner_steps=inner_steps,
                                      wire=tuple(WireLink(between=p) for p in (("A", "B"), ("A", "C"), ("B", "C")))))
    path = tmp_path / "islands.json"
    plan.save(path)
    return path


def run_islands(path: Path, *args: str, timeout: float = 200,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hetauto.cli", "run", str(path), "--steps", str(STEPS), "--json",
                           "--timeout", str(TIMEOUT), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def final_params(ck: Path, island: str, steps: int = STEPS) -> dict[str, torch.Tensor]:
    """The parameters of island `island`'s last checkpoint (after the last step), by canonical name."""
    from tests.islands.test_island_checkpoint import _tensors

    folder = ck / f"island-{island}" / f"step-{steps - 1:08d}"
    return {k[len("model."):]: v for k, v in _tensors(folder).items() if k.startswith("model.")}


def test_member_weights_renormalise_over_the_members_and_keep_the_plans_when_all_are() -> None:
    from hetauto.runtime.island_members import member_weights

    weights = (0.25, 0.5, 0.25)
    assert member_weights(weights, (0, 1, 2)) == weights
    assert member_weights(weights, (0, 1)) == pytest.approx((1 / 3, 2 / 3))
    assert member_weights(weights, (2,)) == (1.0,)


def _store() -> tuple[Any, str]:
    import datetime

    import torch.distributed as dist

    from hetauto.testing.multiproc import free_port

    port = free_port()
    return dist.TCPStore("127.0.0.1", port, None, True, datetime.timedelta(seconds=10),
                         wait_for_workers=False), f"127.0.0.1:{port}"


def test_survivors_agree_the_members_once_and_a_marked_island_is_not_waited_for() -> None:
    """Two survivors of three islands: the first to ask decides, the other adopts; island 2, marked lost by its
    launcher, is dropped without waiting out the timeout; an island left out learns so in one line."""
    from hetauto.runtime.island_members import DroppedFromSync, Membership, mark_lost, next_members

    store, address = _store()
    assert mark_lost(address, 2, 1, 5.0)
    start = Membership(0, (0, 1, 2))
    got: dict[int, Any] = {}

    def survivor(island: int) -> None:
        got[island] = next_members(store, start, island, 0, timeout_s=30, store_address=address, store_island="A")

    t0 = time.monotonic()
    threads = [threading.Thread(target=survivor, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert time.monotonic() - t0 < 5  # not the 30 s timeout
    assert got[0] == got[1] and got[0].membership == Membership(1, (0, 1)) and got[0].dropped == (2,)
    with pytest.raises(DroppedFromSync, match="went on without island 2 from epoch 1"):
        next_members(store, start, 2, 0, timeout_s=1, store_address=address, store_island="A")


def test_a_beat_that_stands_still_is_gone_after_the_bound_and_one_that_moves_never() -> None:
    from hetauto.runtime.island_beat import BeatWatch, beat_key, stale_after_s

    beats, now = {beat_key(0): 5, beat_key(1): 7}, [0.0]
    watch = BeatWatch(beats.get, 20.0, clock=lambda: now[0])
    assert stale_after_s(20.0) == 2.0 and stale_after_s(20.0) < 20.0
    for t in (0.0, 1.0, 1.9, 2.5, 30.0):  # island 1 beats at every look, island 0 stopped at 5, island 2 never beat
        now[0], beats[beat_key(1)] = t, beats[beat_key(1)] + 1
        assert not watch.gone(1) and not watch.gone(2)
        assert watch.gone(0) == (t >= 2.0), t


def _beating(address: str, islands: tuple[int, ...], timeout_s: float) -> list[Any]:
    from hetauto.runtime.island_beat import Heartbeat

    return [Heartbeat(address, i, timeout_s).start() for i in islands]


def test_an_island_whose_beat_stopped_is_dropped_long_before_the_timeout_and_a_slow_one_is_kept() -> None:
    """Across sites the decider sees neither a launcher's mark nor the lost island's process: its stopped beat
    drops it within the bound (timeout / 10); an island that still beats but answers late (a long step) is
    waited for and kept."""
    from hetauto.runtime.island_beat import stale_after_s
    from hetauto.runtime.island_members import Membership, next_members

    timeout = 10.0
    store, address = _store()
    beats = _beating(address, (0, 1, 2), timeout)
    time.sleep(0.5)
    beats[2].stop()  # island 2 died
    got: dict[int, Any] = {}
    start = Membership(0, (0, 1, 2))

    def survivor(island: int, delay: float = 0.0) -> None:
        time.sleep(delay)
        got[island] = next_members(store, got[island].membership if island in got else start, island, 0,
                                   timeout_s=timeout, store_address=address, store_island="A")

    t0 = time.monotonic()
    threads = [threading.Thread(target=survivor, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert time.monotonic() - t0 < timeout / 2  # the stale beat (1 s here), never the timeout: slack for a loaded host
    assert got[0] == got[1] and got[0].dropped == (2,) and got[0].membership == Membership(1, (0, 1))
    slow = threading.Thread(target=survivor, args=(1, 2 * stale_after_s(timeout)))  # epoch 1: island 1 is slow
    slow.start()
    got[0] = next_members(store, got[0].membership, 0, 0, timeout_s=timeout, store_address=address,
                          store_island="A")
    slow.join()
    assert got[0].dropped == () and got[0].membership == Membership(2, (0, 1))
    for beat in beats[:2]:
        beat.stop()


def test_a_returning_island_is_admitted_after_the_members_next_landing() -> None:
    from hetauto.runtime.island_members import Membership, ask_to_join, newest, offer_admission

    store, address = _store()
    store.set("outer/e0/next", json.dumps({"members": [0, 1], "dropped": [2]}))  # island 2 was dropped
    dropped = Membership(1, (0, 1))
    box: dict[str, Any] = {}
    joiner = threading.Thread(target=lambda: box.update(adm=ask_to_join(store, 2, timeout_s=20,
                                                                        store_address=address, store_island="A")))
    joiner.start()
    while not store.check(["outer/join/e1/i2"]):
        time.sleep(0.01)
    adm = offer_admission(store, dropped, 3, 5, 7, store_address=address, store_island="A")  # landed step 5
    assert adm is not None and adm.after_step == 7 and adm.joined == (2,) and adm.membership == Membership(2, (0, 1, 2))
    assert offer_admission(store, dropped, 3, 7, 9, store_address=address, store_island="A") == adm  # the other
    joiner.join()
    assert box["adm"] == adm
    assert newest(store, address, "A", Membership(0, (0, 1, 2))) == (dropped, adm)


def test_an_island_that_trained_no_step_is_one_named_line_not_an_index_error() -> None:
    from hetauto.core.errors import CommunicationError
    from hetauto.job.island_result import _check_trained

    _check_trained("C", [{"step_s": [0.1], "rank": 0}])
    for reports in ([], [{"step_s": [], "rank": 0}]):
        with pytest.raises(CommunicationError, match="^island C: its job ended without training a step"):
            _check_trained("C", reports)


def test_a_lost_island_is_not_restarted_once_the_others_have_finished(monkeypatch: pytest.MonkeyPatch) -> None:
    """--max-restarts: restarting an island after every other one signed off (or island 0, the store's, ended)
    would only meet a closed store; the launcher says so in one line instead."""
    from types import SimpleNamespace

    import hetauto.runtime.island_holders as holders
    import hetauto.runtime.island_members as members
    from hetauto.job.island_launch import _Islands

    done = [1]
    monkeypatch.setattr(holders, "holder_groups", lambda plan: [SimpleNamespace(members=(0, 0, 0))])
    monkeypatch.setattr(members, "signed_off", lambda address, timeout_s: done[0])
    said: list[str] = []
    isl = object.__new__(_Islands)
    isl.lock, isl.stop_reason, isl.stopped, isl.restarts, isl.outcomes = threading.Lock(), None, set(), {}, {}
    isl.runs = [SimpleNamespace(island=SimpleNamespace(name=n), options=SimpleNamespace(
        island=SimpleNamespace(store="127.0.0.1:1"), training=SimpleNamespace(timeout_s=5.0))) for n in NAMES]
    isl.job = SimpleNamespace(plan=None, request=SimpleNamespace(max_restarts=1, warn=said.append))
    assert isl._may_restart(2) and not said  # one of A's and B's holders still trains
    done[0] = 2
    assert not isl._may_restart(2)
    assert said == ["hetauto run: note: island C not restarted: the other islands had already finished (they signed "
                    "off the outer store), so nothing is left to take it back"]
    done[0], isl.outcomes = 0, {0: []}
    assert not isl._may_restart(2)


def test_the_lost_line_says_when_an_island_was_dropped_and_whether_it_came_back() -> None:
    from hetauto.commands._island_run import lost_line

    row = {"island": "C", "index": 2, "reason": "x", "dropped_at_step": 3, "fragment": 0, "round": 2,
           "recovery_s": 0.41, "came_back": None}
    assert lost_line(row) == ("lost: island C: dropped from the outer sync at step 3 (round 2, fragment 0); the "
                              "others' round completed 0.41 s after they found it lost; never came back")
    assert lost_line({**row, "came_back": 9}).endswith("; taken back at step 9")
    assert lost_line({**row, "dropped_at_step": None}) == ("lost: island C: no outer sync came after its loss; "
                                                           "never came back")


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_a_killed_island_is_dropped_and_the_others_match_the_reference(tmp_path: Path) -> None:
    from hetauto.core.plan_check import load_model_for_plan
    from hetauto.core.run_config import RunConfig
    from hetauto.runtime.island_reference import reference_islands

    path = three_islands(tmp_path)
    ck = tmp_path / "ck"
    t0 = time.monotonic()
    proc = run_islands(path, "--inject-fault", f"rank=2,step={LOST_AT}", "--checkpoint-dir", str(ck),
                       "--checkpoint-every", str(STEPS))
    took = time.monotonic() - t0
    assert proc.returncode == 3, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hetauto run: error:")]
    assert len(errors) == 1 and errors[0].startswith("hetauto run: error: island C: rank 0 (stage 0, cluster 'c')"), \
        proc.stderr[-3000:]
    assert "the other islands (A, B) trained on without it" in errors[0]
    doc = json.loads(proc.stdout)
    assert [i["name"] for i in doc["islands"]] == ["A", "B"]
    assert doc["lost"] == [{"island": "C", "index": 2, "reason": doc["lost"][0]["reason"], "dropped_at_step": 3,
                            "fragment": 0, "round": 2, "recovery_s": doc["lost"][0]["recovery_s"],
                            "came_back": None}]
    assert doc["lost"][0]["recovery_s"] < TIMEOUT / 2  # the launcher told the survivors: no timeout waited out
    assert took < 200
    plan = IslandPlan.load(path)
    ref = reference_islands(plan, load_model_for_plan(plan.islands[0].plan),
                            RunConfig.from_flat(steps=STEPS, seed=0), lost={2: LOST_AT})
    for isl in doc["islands"]:
        assert len(isl["loss"]) == STEPS
        assert isl["loss"] == pytest.approx(list(ref.losses[isl["index"]]), abs=isl["loss_tolerance"])
        assert [(x["step"], x["peers"], x.get("dropped")) for x in isl["outer_syncs"]] == [
            (1, [n for n in NAMES if n != isl["name"]], None), (3, [n for n in "AB" if n != isl["name"]], ["C"]),
            (5, [n for n in "AB" if n != isl["name"]], None)]
    assert doc["reference"] == "checked" and doc["loss_off_reference"] is None
    a, b = final_params(ck, "A"), final_params(ck, "B")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "the survivors' parameters differ"
    for name, value in a.items():  # the survivors-only merge of the reference (the same ops; threads may differ)
        torch.testing.assert_close(value, ref.params[0][name], rtol=1e-5, atol=1e-6)


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_without_the_launchers_marks_a_killed_island_is_dropped_by_its_stopped_beat(tmp_path: Path) -> None:
    """As across sites (HETAUTO_ISLAND_AS_REMOTE=1: no launcher's mark, no process seen on this host): island C
    killed at step 3 is dropped when its beat has stood still for timeout / 10, and island A, which serves the
    store, stops waiting for C's sign-off the same way: the whole run costs far less than two timeouts."""
    from hetauto.runtime.island_beat import AS_REMOTE_ENV

    path = three_islands(tmp_path)
    log = tmp_path / "fault.jsonl"
    proc = run_islands(path, "--inject-fault", f"rank=2,step={LOST_AT}", "--no-reference",
                       env={AS_REMOTE_ENV: "1", "HETAUTO_FAULT_LOG": str(log)})
    ended = time.time()
    assert proc.returncode == 3, proc.stderr[-3000:]
    (lost,) = json.loads(proc.stdout)["lost"]
    assert lost["island"] == "C" and lost["dropped_at_step"] == LOST_AT, lost
    assert lost["recovery_s"] < TIMEOUT / 2, lost  # the stale beat (2 s), not the timeout: slack for a loaded host
    fired = json.loads(log.read_text().splitlines()[0])["unix"]
    assert ended - fired < TIMEOUT, ended - fired  # waiting out the decider's and A's end timeouts took 2 x TIMEOUT


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_losing_the_store_island_is_one_named_line_within_the_timeout(tmp_path: Path) -> None:
    """Island 0's rank 0 serves the outer store: when it dies, the others cannot agree a new membership; each
    says so in one line naming the store and its island, at once (no timeout is waited out)."""
    path = three_islands(tmp_path)
    log = tmp_path / "fault.jsonl"
    proc = run_islands(path, "--inject-fault", f"rank=0,step={LOST_AT}", "--no-reference",
                       env={"HETAUTO_FAULT_LOG": str(log)})
    ended = time.time()
    assert proc.returncode == 3, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, proc.stderr[-3000:]
    line = errors[0]
    assert line.startswith("hetauto run: error: island A: rank 0 (stage 0, cluster 'a') died"), line
    assert "StoreLost: the outer sync's store at 127.0.0.1:" in line and "served by island A's rank 0" in line, line
    fired = json.loads(log.read_text().splitlines()[0])["unix"]
    assert ended - fired < TIMEOUT, (ended - fired, line)  # found lost at once, not after a timeout


RESTART_STEPS = 24


@dataclass(frozen=True)
class RestartedRun:
    """A finished restart run: its exit code, output and checkpoint folder."""

    returncode: int
    stdout: str
    stderr: str
    ck: Path


def _start_restarted_run(folder: Path, as_remote: bool) -> subprocess.Popen:
    """`hetauto run` of three islands in `folder`, island C killed at step 2 and restarted (--max-restarts 1);
    started, not waited for. Its output goes to files (out.txt, err.txt): another run may be waited for first."""
    from hetauto.runtime.island_beat import AS_REMOTE_ENV

    folder.mkdir()
    path = three_islands(folder, inner_steps=1, latency="1500ms")
    with (folder / "out.txt").open("w") as out, (folder / "err.txt").open("w") as err:
        return subprocess.Popen([sys.executable, "-m", "hetauto.cli", "run", str(path), "--steps", str(RESTART_STEPS),
                                 "--json", "--timeout", str(TIMEOUT), "--emulate", "--no-reference", "--max-restarts",
                                 "1", "--inject-fault", "rank=2,step=2", "--checkpoint-dir", str(folder / "ck"),
                                 "--checkpoint-every", str(RESTART_STEPS)], stdout=out, stderr=err, text=True,
                                env={**os.environ, **({AS_REMOTE_ENV: "1"} if as_remote else {})})


@pytest.fixture(scope="module")
def restarted_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[bool, RestartedRun]]:
    """Both restart runs (marked, as-remote) by as_remote, started together and each waited for. Why together: each
    is ~40 s of waiting on its emulated link (24 outer steps of >= 1.5 s) for a few CPU-s, and the two share nothing
    (ports from the OS, a folder each): the file waits once, not twice."""
    root = tmp_path_factory.mktemp("restarted")
    folders = {as_remote: root / ("as-remote" if as_remote else "marked") for as_remote in (False, True)}
    procs = {as_remote: _start_restarted_run(folder, as_remote) for as_remote, folder in folders.items()}
    try:
        for proc in procs.values():
            proc.wait(timeout=280)
        yield {as_remote: RestartedRun(proc.returncode, (folders[as_remote] / "out.txt").read_text(),
                                       (folders[as_remote] / "err.txt").read_text(), folders[as_remote] / "ck")
               for as_remote, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
@pytest.mark.parametrize("as_remote", [False, True], ids=["marked", "as-remote"])
def test_a_lost_island_restarted_is_taken_back_and_every_island_ends_equal(
        restarted_runs: dict[bool, RestartedRun], as_remote: bool) -> None:
    """--max-restarts 1: island C killed at step 2 is started again by the launcher (no checkpoint yet: from
    scratch), asks to join, and the others take it back after their next outer step with the global parameters and
    outer state; it trains on from there (its own steps are dropped) and every island ends with the same
    parameters bit for bit (the last step's outer step lands on all three). Each sync lasts >= 1.5 s (the emulated
    link's latency, H = 1), so the others are still training when C is back (its launcher sees it die after
    ~5-10 s, and a torchrun job starts in ~10 s on a loaded machine). As-remote (no launcher's mark, no process
    check: HETAUTO_ISLAND_AS_REMOTE=1) it is what a job resubmitted on another site meets: the others drop C by its
    stopped beat, and C's holders know they are back by their earlier start on the store alone. Both runs go at
    once (restarted_runs)."""
    steps = RESTART_STEPS
    run = restarted_runs[as_remote]
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(run.stdout)
    assert [i["name"] for i in doc["islands"]] == ["A", "B", "C"]
    (lost,) = doc["lost"]
    assert lost["island"] == "C" and lost["dropped_at_step"] == 2 and 2 < lost["came_back"] < steps, lost
    back = doc["islands"][2]
    assert back["start_step"] == lost["came_back"] and len(back["loss"]) == steps - lost["came_back"], back
    for isl in doc["islands"][:2]:
        joined = [x["step"] for x in isl["outer_syncs"] if "joined" in x]
        assert joined == [lost["came_back"] - 1] and len(isl["loss"]) == steps
    a, b, c = (final_params(run.ck, n, steps) for n in NAMES)
    for other in (b, c):
        assert a.keys() == other.keys() and all(torch.equal(a[k], other[k]) for k in a)
