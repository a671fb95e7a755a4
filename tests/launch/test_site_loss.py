"""A site is a failure domain (`hetauto launch --on-site-loss replan`, hetauto.launch.site_loss): three sites of
one node each on 127.0.0.1, the scripts `hetauto launch` wrote run as written; site c killed at a step, the lead
re-plans onto a and b and the job goes on from the newest verified checkpoint, its losses the single-process
reference's from that step on. Without the flag a killed site ends the job as before; a loss that leaves nothing
able to hold the model ends it in one line."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from hetauto.cli import main
from hetauto.job.site_replan import replan
from hetauto.launch.diagnosis import JobFailed
from hetauto.launch.launch_match import find_mismatch, launch_parts
from hetauto.launch.plan import LaunchPlan
from hetauto.launch.replan import SiteLossFatal
from hetauto.launch.site_loss import HEARD_S, lost_sites
from hetauto.testing.multiproc import two_free_ports
from hetauto.testing.three_sites import await_step, sites_running, steps_seen, submit_again, write_three_site_plan

STEPS, KILL_AT, GRACE_S = 8, 2, 10
TAKE_BACK_STEPS = 40


def _launch(root: Path, *extra: str, plan: Path | None = None, steps: int = STEPS) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    plan = plan or write_three_site_plan(root)
    out = root / "out"
    assert main(["launch", str(plan), "--target", "torchrun", "--master", f"127.0.0.1:{two_free_ports()}", "-o",
                 str(out), "--steps", str(steps), "--timeout", str(GRACE_S), "--checkpoint-dir", str(root / "ck"),
                 *extra]) == 0
    return out


def test_the_option_travels_in_the_launch_plan_and_the_join_compares_it(tmp_path: Path) -> None:
    _launch(tmp_path / "off")
    assert "on_site_loss" not in (tmp_path / "off" / "out" / "launch.json").read_text()  # as launches always were
    on = LaunchPlan.load(_launch(tmp_path / "on", "--on-site-loss", "replan") / "launch.json")
    off = on.model_copy(update={"on_site_loss": "end"})
    assert on.on_site_loss == "replan"
    assert LaunchPlan.load(tmp_path / "off" / "out" / "launch.json").on_site_loss == "end"
    mismatch = find_mismatch(launch_parts(on), launch_parts(off))  # a node launched without it is refused at join
    assert mismatch is not None and mismatch.said("here", "there", True) == \
        "the launch's sites and nodes differ: on_site_loss replan here, unset there"


@pytest.fixture()
def three(tmp_path: Path) -> LaunchPlan:
    return LaunchPlan.load(_launch(tmp_path, "--on-site-loss", "replan") / "launch.json")


def test_lost_sites_waits_for_the_grace_and_names_only_the_silent_site(three: LaunchPlan) -> None:
    now = [0.0]
    silence = {1: lambda: 0.2, 2: lambda: 0.5 + now[0]}  # b beats on; c went quiet half a second before the failure
    lost = lost_sites(three, lambda r: silence[r](), GRACE_S, clock=lambda: now[0],
                      sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert lost == ["c"] and GRACE_S - 0.5 <= now[0] <= GRACE_S + HEARD_S
    now[0] = 0.0  # every agent heard: the ranks failed on their own, no site is lost (after HEARD_S, not the grace)
    assert lost_sites(three, lambda r: 0.1, GRACE_S, clock=lambda: now[0],
                      sleep=lambda s: now.__setitem__(0, now[0] + s)) == []
    assert now[0] <= HEARD_S + 0.5


def test_a_site_whose_agent_closed_every_connection_is_lost_without_waiting_out_the_grace(three: LaunchPlan) -> None:
    now = [0.0]
    silence = {1: lambda: 0.2, 2: lambda: 0.5 + now[0]}  # c stopped beating, and its connections closed (killed)
    lost = lost_sites(three, lambda r: silence[r](), GRACE_S, closed=lambda r: r == 2, clock=lambda: now[0],
                      sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert lost == ["c"] and now[0] <= HEARD_S + 0.5
    now[0] = 0.0  # closed but still beating (a new connection on its way): not lost, and the ranks failed alone
    assert lost_sites(three, lambda r: 0.1, GRACE_S, closed=lambda r: True, clock=lambda: now[0],
                      sleep=lambda s: now.__setitem__(0, now[0] + s)) == []


def test_the_lead_store_knows_when_a_roles_every_connection_closed(tmp_path: Path) -> None:
    from hetauto.core.control_store import ControlStoreClient
    from hetauto.launch.control import ControlServer

    server = ControlServer(tmp_path, token="s3cret").start()
    try:
        assert server.closed_for("node2") is None  # never connected
        first = ControlStoreClient("127.0.0.1", server.port, 5.0, token="s3cret", role="node2")
        second = ControlStoreClient("127.0.0.1", server.port, 5.0, token="s3cret", role="node2")
        first.close()
        time.sleep(0.3)
        assert server.closed_for("node2") is None  # one still open
        second.close()
        end = time.monotonic() + 5
        while server.closed_for("node2") is None and time.monotonic() < end:
            time.sleep(0.05)
        assert server.closed_for("node2") is not None and server.closed_for("node1") is None
    finally:
        server.shutdown()


def test_a_loss_that_leaves_nothing_able_to_hold_the_model_is_one_line(three: LaunchPlan, tmp_path: Path) -> None:
    """The lead's folder as the agent wrote it, its cluster file's devices cut to 2 MiB: three of them hold
    tiny-gpt's six layers (two each), two of them do not."""
    work = tmp_path / "node0"
    work.mkdir()
    cpu = (Path(__file__).resolve().parents[2] / "hetauto" / "data" / "devices" / "cpu.yaml").read_text()
    (work / "small.yaml").write_text(cpu.replace("memory_bytes: 16GiB", "memory_bytes: 2MiB")
                                     .replace("key: cpu", "key: smallcpu"))
    for name, text in three.files.items():
        (work / name).write_text(text.replace("device: cpu", "device: small.yaml"))
    launch = three
    with pytest.raises(SiteLossFatal) as err:  # 2 MiB devices: a and b cannot hold 3 layers of tiny-gpt each
        replan(launch, launch.the_plan(), work, ["c"], seed=0, budget_s=2)
    line = str(err.value)
    assert "\n" not in line and line.startswith("site(s) 'c' lost: the clusters left (a, b) cannot hold the model: ")
    with pytest.raises(SiteLossFatal, match="the lead's among them"):
        replan(launch, launch.the_plan(), work, ["a"], seed=0, budget_s=2)


def test_a_later_epoch_keeps_the_agents_visible_devices_mode(three: LaunchPlan, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent started with --visible-devices scheduler (a GPU site whose scheduler chose the devices) keeps its
    scheduler's variable in every epoch's job; with plan, each epoch sets the plan's devices."""
    from hetauto.launch.node_epoch import epoch_job
    from hetauto.launch.node_job import prepare_node
    from hetauto.launch.site_loss import new_epoch

    doc = json.loads(three.to_json(indent=None))
    for site in doc["sites"]:
        for node in site["nodes"]:
            node["visible_devices_env"] = ["CUDA_VISIBLE_DEVICES"]
    gpu = LaunchPlan.model_validate(doc)
    epoch = new_epoch(1, gpu, None, ["c"], "site c lost", time.time())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    for mode, seen in (("scheduler", "3"), ("plan", "0")):
        job = prepare_node(gpu, 1, tmp_path / mode, visible_devices=mode)
        assert job.env["CUDA_VISIBLE_DEVICES"] == seen
        later = epoch_job(job, epoch, tmp_path / mode)
        assert later is not None and later.visible_devices == mode and later.env["CUDA_VISIBLE_DEVICES"] == seen


@pytest.mark.multiprocess
@pytest.mark.timeout(500)
def test_a_site_killed_at_a_step_is_replanned_around_and_taken_back_when_it_returns(tmp_path: Path) -> None:
    """Site c killed at step KILL_AT: epoch 1 on a and b; c's script submitted again meanwhile: epoch 2 takes it
    back at the next checkpoint. Every surviving node and the returned one exit 0; the last epoch's losses are the
    reference's from its checkpoint on. TAKE_BACK_STEPS, not STEPS: c's agent must ask before epoch 1 has trained
    the last step (a site back after that is not taken: nothing is left to train), and 5 steps of ~10 ms went by
    before it asked in about half the runs alone."""
    out = _launch(tmp_path, "--on-site-loss", "replan", steps=TAKE_BACK_STEPS)
    lead_dir = tmp_path / "node0"
    with sites_running(out, tmp_path) as (lead, b, c):
        await_step(lead_dir, lead, KILL_AT, 240)
        os.killpg(c.pid, signal.SIGKILL)  # the site's agent, its torchrun and (by their watchdog) its ranks
        again = submit_again(out, tmp_path, lead_dir / "epoch1")
        try:
            _, err = lead.communicate(timeout=400)
            _, b_err = b.communicate(timeout=60)
            _, again_err = again.communicate(timeout=60)
        finally:
            if again.poll() is None:
                again.kill()
    assert lead.returncode == 0, err[-4000:]
    assert b.returncode == 0, b_err[-3000:]
    assert again.returncode == 0, again_err[-3000:]
    doc = json.loads((lead_dir / "result.json").read_text())
    first, lost, back = doc["epochs"]
    assert first["number"] == 0 and first["clusters"] == ["a", "b", "c"] and first["lost"] == []
    assert lost["lost"] == ["c"] and lost["clusters"] == ["a", "b"] and lost["world_size"] == 2
    assert lost["plan_sha256"] != first["plan_sha256"] and lost["first_step_s"] > 0
    assert json.loads((lead_dir / "epoch1" / "run" / "plan.json").read_text())["stages"][-1]["cluster"] == "b"
    assert back["returned"] == ["c"] and back["lost"] == [] and back["clusters"] == ["a", "b", "c"]
    assert back["step"] > lost["step"]  # taken back at a checkpoint written on the plan without c
    resumed = back["step"] + 1  # the checkpoint of step s holds steps 0..s: training goes on at s + 1
    steps = steps_seen(lead_dir)
    assert steps[-(TAKE_BACK_STEPS - resumed):] == list(range(resumed, TAKE_BACK_STEPS))  # after the resume, once
    assert steps[:KILL_AT + 1] == list(range(KILL_AT + 1))
    assert len(doc["loss"]) == TAKE_BACK_STEPS - resumed  # the reference's, from that step on
    assert doc["max_loss_diff"] < 1e-5
    assert sorted(r["rank"] for r in doc["ranks"]) == [0, 1, 2]
    assert "epoch 1: plan" in err and "began when site(s) c were lost" in err
    assert "began when site(s) c came back" in err
    assert "started 1 rank(s) 1-1 for epoch 1" in b_err
    assert "asked the lead to take it back" in again_err and "epoch 2: plan" in again_err


@pytest.mark.multiprocess
@pytest.mark.timeout(400)
def test_without_the_flag_a_killed_site_ends_the_job_naming_it_as_before(tmp_path: Path) -> None:
    out = _launch(tmp_path)
    with sites_running(out, tmp_path) as (lead, b, c):
        await_step(tmp_path / "node0", lead, 0, 240)
        os.killpg(c.pid, signal.SIGKILL)
        _, err = lead.communicate(timeout=120)
        _, b_err = b.communicate(timeout=60)
    assert lead.returncode == JobFailed("").exit_code and b.returncode != 0, err[-3000:]
    line = err.strip().splitlines()[-1]
    assert re.match(r"hetauto node: error: rank 2 \(stage 2, cluster 'c'\) failed: LauncherGone: its launcher "
                    rf"\(pid {c.pid}\) is gone", line), line
    assert b_err.strip().splitlines()[-1].startswith("hetauto node: error: the lead node ended the job: rank 2 ")
    assert "epoch" not in err and not (tmp_path / "node0" / "epoch1").exists()


class _Store:
    """The lead's store as ReturnWatch reads it (hetauto.launch.control.ControlServer.get: str or None)."""

    def __init__(self) -> None:
        self.keys: dict[str, str] = {}

    def get(self, key: str) -> str | None:
        return self.keys.get(key)

    def delete(self, key: str) -> None:
        self.keys.pop(key, None)

    def set(self, key: str, value: str) -> None:
        self.keys[key] = value

    def agent_silence(self, node_rank: int) -> float:
        return 0.5


def test_a_returned_site_is_taken_back_only_after_a_newer_checkpoint_and_only_with_this_launch() -> None:
    from hetauto.launch.site_return import ReturnWatch, return_key

    store, newest, now = _Store(), [3], [0.0]
    watch = ReturnWatch(store, lambda: {"c": [2]}, lambda: newest[0],
                        lambda reg: None if reg.get("plan_sha256") == "ours" else "another launch",
                        clock=lambda: now[0])

    def poll() -> str | None:
        now[0] += 1.0
        return watch()

    assert poll() is None  # nobody asked
    store.keys[return_key(2)] = json.dumps({"plan_sha256": "theirs"})
    assert poll() is None  # another launch's agent is not let in
    store.keys[return_key(2)] = json.dumps({"plan_sha256": "ours"})
    assert poll() is None  # asked: waits for a checkpoint newer than step 3
    newest[0] = 4
    assert poll() == "site(s) c came back: stopped the ranks at the checkpoint of step 4"
    sites, _ = watch.taken()
    assert sites == ["c"] and watch.taken()[0] == []
    assert store.keys == {"hetauto/node/2/1": json.dumps({"plan_sha256": "ours"})}  # answered; its node's now
    assert poll() is None


def test_a_site_that_returns_once_the_last_step_is_checkpointed_is_not_taken_back() -> None:
    """Nothing is left to train: stopping the ranks there started an epoch of 0 steps (seen: the lead's result
    failed on its empty reports, and a node already ending was declared lost after the grace)."""
    from hetauto.launch.site_return import ReturnWatch, return_key

    store, newest, now = _Store(), [3], [0.0]
    watch = ReturnWatch(store, lambda: {"c": [2]}, lambda: newest[0], lambda reg: None, clock=lambda: now[0],
                        last_step=STEPS - 1)
    store.keys[return_key(2)] = json.dumps({"plan_sha256": "ours"})
    now[0] += 1.0
    assert watch() is None  # asked at step 3's checkpoint
    newest[0], now[0] = STEPS - 1, now[0] + 1.0
    assert watch() is None  # the last step's checkpoint: the job ends without c
    newest[0], now[0] = STEPS - 2, now[0] + 1.0
    assert watch() == f"site(s) c came back: stopped the ranks at the checkpoint of step {STEPS - 2}"


def test_the_board_shows_the_current_epoch_its_sites_and_the_lost_ones(three: LaunchPlan, tmp_path: Path) -> None:
    """`hetauto job status` after site b was lost: epoch 1's plan digest, sites and nodes (c is node rank 1 now,
    shown with the host it joined with as node rank 2), and b lost; --json too."""
    from hetauto.commands.job import status_lines
    from hetauto.launch.job_board import STATUS_KEY, LeadBoard
    from hetauto.launch.node_epoch import epoch_job
    from hetauto.launch.node_job import prepare_node
    from hetauto.launch.replan import epoch_launch
    from hetauto.launch.site_loss import new_epoch

    job = prepare_node(three, 0, tmp_path / "node0")
    launch = epoch_launch(three, replan(three, three.the_plan(), job.workdir, ["b"], seed=0, budget_s=1),
                          job.workdir, ["b"], None)
    epoch = new_epoch(1, launch, None, ["b"], "site b lost", time.time())
    store = _Store()
    store.keys["hetauto/node/2/1"] = json.dumps({"host": "host-c", "pid": 7})
    board = LeadBoard(job, store, None)
    board.publish()
    assert json.loads(store.keys[STATUS_KEY])["epoch"] == 0 and "epoch" not in " ".join(
        status_lines(json.loads(store.keys[STATUS_KEY])))  # a job on its launch's plan: as before
    board.follow(epoch_job(job, epoch, job.workdir), 1, ["b"])
    doc = json.loads(store.keys[STATUS_KEY])
    assert doc["epoch"] == 1 and doc["plan_sha256"] == launch.plan_sha256 != three.plan_sha256
    assert doc["sites"] == ["a", "c"] and doc["lost_sites"] == ["b"] and doc["num_nodes"] == 2
    assert [(n["node_rank"], n["site"], n["host"]) for n in doc["nodes"]][1] == (1, "c", "host-c")
    assert f"epoch 1 (plan {launch.plan_sha256[:12]}) on site(s) a, c; lost: b" in status_lines(doc)


def test_a_site_lost_by_its_closed_connections_is_said_so_at_once_not_as_the_ranks_timeout(
        three: LaunchPlan, monkeypatch: pytest.MonkeyPatch) -> None:
    """The epoch's reason for a site whose agent closed its connections (killed) names that, without waiting out
    the link grace (hetauto.launch.node_failure.wait_out_the_grace would, for a silence past half of it)."""
    from types import SimpleNamespace

    from hetauto.launch import node_epoch, node_failure

    class Store:
        def agent_silence(self, node_rank: int) -> float:
            return 0.2 if node_rank == 1 else GRACE_S * 0.75  # c: silent past the link's threshold, not the grace

        def closed_for(self, role: str) -> float | None:
            return 4.0 if role == "node2" else None

    monkeypatch.setattr(node_failure, "wait_out_the_grace", lambda *a, **k: pytest.fail("waited out the grace"))
    run = SimpleNamespace(job=SimpleNamespace(launch=three), origin=three, store=Store(), grace_s=GRACE_S)
    lost, why = node_epoch._lost_now(run, JobFailed("rank 2 stopped responding", 2))
    assert lost == ["c"] and why == ("the agent(s) of site(s) 'c' closed every connection to the lead's store and "
                                     "opened none again (their node(s) ended)")
