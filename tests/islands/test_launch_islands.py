"""`hetauto launch ISLAND_PLAN.json` (issue 40 item 4): one ordinary launch per island, each island's ranks given
`run.island` (the island plan the launch carries, the island's index, the outer store).

Checked: the torchrun target's scripts of a two-island plan, run as written (each island's lead on 127.0.0.1 with its
own ports), train each island to the single-process island reference; the slurm, kubernetes and skypilot artifacts
of an island plan pass the checks the ordinary ones pass (tests/launch/test_launch_slurm.py, test_launch_targets_k8s_sky.py);
the join check refuses a node of another island or another island launch naming both; the refusals' exact words."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from hetauto.cli import main
from hetauto.core.islands import Island, IslandPlan, OuterSync, WireLink
from hetauto.core.plan import Plan, StagePlan
from hetauto.launch.plan import LaunchPlan

STEPS = 3
FOUR = """clusters:
  - {name: a1, nodes: {count: 1, devices_per_node: 1, device: cpu}}
  - {name: a2, nodes: {count: 1, devices_per_node: 1, device: cpu}}
  - {name: b1, nodes: {count: 1, devices_per_node: 1, device: cpu}}
  - {name: b2, nodes: {count: 1, devices_per_node: 1, device: cpu}}
links:
  default: {bandwidth: 1Gbps, latency: 10ms}
"""


def _plan(cluster: str, batch: int, *stages: tuple[str, tuple[int, int]]) -> Plan:
    return Plan(model="tiny-gpt", cluster=cluster, seq_len=16, global_batch=batch, microbatch_size=2,
                num_microbatches=batch // 2,
                stages=tuple(StagePlan(cluster=c, device_type="cpu", devices=(0,), layers=layers, tp=1, dp=1)
                             for c, layers in stages))


def two_islands(folder: Path, inner_steps: int = 2) -> Path:
    """Two 1-rank islands over the cpu-demo scenario's clusters (as tests/islands/test_island_run.py's): a sync after step 1."""
    plan = IslandPlan(model="tiny-gpt", cluster="cpu-demo", seq_len=16, global_batch=10,
                      islands=(Island(name="FAST", plan=_plan("cpu-demo", 6, ("fast", (0, 6)))),
                               Island(name="SLOW", plan=_plan("cpu-demo", 4, ("slow", (0, 6))))),
                      outer=OuterSync(inner_steps=inner_steps, wire=(WireLink(between=("FAST", "SLOW")),)))
    plan.save(folder / "islands.json")
    return folder / "islands.json"


def pipelined_islands(folder: Path, inner_steps: int = 2) -> Path:
    """Islands A (a1 -> a2) and B (b1 -> b2), each pipelined over two 1-device clusters: two sites, two nodes each."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "four.yaml").write_text(FOUR, encoding="utf-8")
    plan = IslandPlan(model="tiny-gpt", cluster="four.yaml", seq_len=16, global_batch=12,
                      islands=(Island(name="A", plan=_plan("four.yaml", 8, ("a1", (0, 3)), ("a2", (3, 6)))),
                               Island(name="B", plan=_plan("four.yaml", 4, ("b1", (0, 3)), ("b2", (3, 6))))),
                      outer=OuterSync(inner_steps=inner_steps, wire=(WireLink(between=("A", "B")),)))
    path = folder / f"islands-h{inner_steps}.json"
    plan.save(path)
    return path


def _free_run(count: int) -> int:
    """A port p with p .. p + count - 1 free on the loopback now."""
    from hetauto.launch.ports import free_run

    return free_run(count)


def _launch(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["launch", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# ------------------------------------------------------------------------------------------------ torchrun, run


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_the_torchrun_scripts_train_every_island_to_the_island_reference(tmp_path: Path, capsys) -> None:
    from hetauto.core.plan_check import load_model_for_plan
    from hetauto.core.run_config import RunConfig
    from hetauto.runtime.island_reference import reference_islands
    from hetauto.testing.two_sites import this_tree_env

    path = two_islands(tmp_path)
    port = _free_run(5)  # one --master: FAST at port, port + 1; the outer store port + 2; SLOW port + 3, port + 4
    doc = _launch(capsys, str(path), "--master", f"127.0.0.1:{port}", "-o", str(tmp_path / "out"),
                  "--steps", str(STEPS), "--timeout", "60")
    summary = doc["islands"]
    assert summary["outer_store"]["address"] == f"127.0.0.1:{port + 2}"
    assert [(i["name"], i["master"], i["control_port"]) for i in summary["islands"]] == [
        ("FAST", f"127.0.0.1:{port}", port + 1), ("SLOW", f"127.0.0.1:{port + 3}", port + 4)]
    for index, launch in enumerate(doc["launches"]):
        assert launch["run"]["island"] == {"plan": "island-plan.json", "index": index, "store": f"127.0.0.1:{port + 2}"}
        assert IslandPlan.model_validate_json(launch["files"]["island-plan.json"]) == IslandPlan.load(path)
    procs = []
    for name in ("FAST", "SLOW"):
        (tmp_path / name).mkdir()
        script = tmp_path / "out" / f"island-{name}" / name.lower() / "node0.sh"
        procs.append(subprocess.Popen(["bash", str(script)], cwd=tmp_path / name, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=this_tree_env()))
    errs = []
    for proc in procs:
        _out, err = proc.communicate(timeout=150)
        assert proc.returncode == 0, err[-2000:]
        errs.append(err)
    plan = IslandPlan.load(path)
    ref = reference_islands(plan, load_model_for_plan(plan.islands[0].plan), RunConfig.from_flat(steps=STEPS, seed=0))
    for index, name in enumerate(("FAST", "SLOW")):
        result = json.loads(next((tmp_path / name).glob("hetauto-job-*-node0/result.json")).read_text())
        assert result["loss"] == pytest.approx(list(ref.losses[index]), abs=result["loss_tolerance"]), name
        # the lead's own check: against its row of the island reference, not its plan's (which never syncs)
        assert result["reference_loss"] == pytest.approx(list(ref.losses[index]), abs=1e-12)
        assert result["loss_off_reference"] is None
        island = result["island"]
        assert (island["name"], island["index"], island["rows"], island["rounds"]) == (name, index,
                                                                                      [[0, 6], [6, 10]][index], 1)
        assert [(s["step"], s["peers"]) for s in island["outer_syncs"]] == [(1, ["SLOW" if name == "FAST" else "FAST"])]
        # the lead's log says its rounds as hetauto run ISLAND_PLAN.json does
        assert f"hetauto node 0: island {name}: rounds: 1 (H=2, 1 fragment; 1 sync): " in errs[index], errs[index]


# ------------------------------------------------------------------------------------------ every target's files


def _islands_launch(tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str, *extra: str) -> dict[str, Any]:
    path = pipelined_islands(tmp_path)
    return _launch(capsys, str(path), "--target", target, "--master", "A=10.0.0.1", "--master", "B=10.1.0.1:29600",
                   "-o", str(tmp_path / target), *extra)


def _files(tmp_path: Path, target: str, island: str) -> dict[str, str]:
    root = tmp_path / target / f"island-{island}"
    return {str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file()}


def _island_launch(tmp_path: Path, target: str, island: str) -> LaunchPlan:
    return LaunchPlan.load(tmp_path / target / f"island-{island}" / "launch.json")


def test_an_island_launch_is_an_ordinary_launch_per_island(tmp_path: Path, capsys) -> None:
    doc = _islands_launch(tmp_path, capsys, "torchrun")
    summary = doc["islands"]
    assert summary["outer_store"]["address"] == "10.0.0.1:29502"  # island A's lead, its control port + 1
    assert [(i["name"], i["folder"], i["master"], [s["name"] for s in i["sites"]], i["holder_nodes"])
            for i in summary["islands"]] == [("A", "island-A", "10.0.0.1:29500", ["a1", "a2"], [0, 1]),
                                             ("B", "island-B", "10.1.0.1:29600", ["b1", "b2"], [0, 1])]
    assert summary["islands"][1]["sites"][1]["submit"] == ["island-B/b2/node1.sh"]
    for index, name in enumerate("AB"):
        launch = _island_launch(tmp_path, "torchrun", name)
        assert launch.run_config().island.index == index and launch.run_config().island.store == "10.0.0.1:29502"
        assert launch.reference and "island-plan.json" in launch.files and "cluster-four.yaml" in launch.files
        assert any("10.0.0.1:29502" in need for need in launch.needs)
        assert (tmp_path / "torchrun" / f"island-{name}" / f"{name.lower()}2" / "control.secret").is_file()
    readme = (tmp_path / "torchrun" / "README.txt").read_text()
    assert "island A first: its rank 0 serves the outer store" in readme
    assert "crosses the WAN between the islands" in readme and "10.0.0.1:29502: the outer sync's store" in readme
    secrets = {p.read_text() for p in (tmp_path / "torchrun").rglob("control.secret")}
    assert len(secrets) == 1  # one job secret for every island: a stray node reaches the join check


def test_kubernetes_and_skypilot_files_of_an_island_plan_pass_the_schema_checks(tmp_path: Path, capsys) -> None:
    from tests.launch.test_launch_targets_k8s_sky import assert_valid_jobset, assert_valid_task

    images = [f"--site-option={s}.image=registry.example/hetauto:cpu" for s in ("a1", "a2", "b1", "b2")]
    _islands_launch(tmp_path, capsys, "kubernetes", *images)
    _islands_launch(tmp_path / "sky", capsys, "skypilot", "--site-option", "b2.cloud=kubernetes")
    for name in "AB":
        k8s = _files(tmp_path, "kubernetes", name)
        jobsets = {k: v for k, v in k8s.items() if k.endswith("jobset.yaml")}
        tasks = {k: v for k, v in _files(tmp_path / "sky", "skypilot", name).items() if k.endswith(".yaml")}
        assert len(jobsets) == len(tasks) == 2, (jobsets, tasks)
        # each site's job secret as a Kubernetes Secret of its own, owner-only, as an ordinary launch writes it
        root = tmp_path / "kubernetes" / f"island-{name}"
        secrets = sorted(k for k in k8s if k.endswith("secret.yaml"))
        assert [Path(k).parent.name for k in secrets] == sorted(Path(k).parent.name for k in jobsets)
        assert all((root / k).stat().st_mode & 0o777 == 0o600 for k in secrets)
        launch = _island_launch(tmp_path, "kubernetes", name)
        for text in jobsets.values():
            assert_valid_jobset(yaml.safe_load(text))
            assert _embedded(text) == launch  # the island's launch plan inside, its run.island set
        launch = _island_launch(tmp_path / "sky", "skypilot", name)
        for text in tasks.values():
            assert_valid_task(yaml.safe_load(text))
            assert _embedded(text) == launch
    assert yaml.safe_load(_files(tmp_path / "sky", "skypilot", "B")["b2/task.yaml"])["resources"]["cloud"] == \
        "kubernetes"


def _embedded(text: str) -> LaunchPlan:
    """The launch plan a YAML file carries (its one-line JSON, in a here-document of a pod's or node's script)."""
    (line,) = [ln.strip() for ln in text.splitlines() if ln.strip().startswith('{"schema": "hetauto.launch/1"')]
    return LaunchPlan.model_validate_json(line)


def test_slurm_scripts_of_an_island_plan_give_each_node_its_islands_launch(tmp_path: Path, capsys) -> None:
    from tests.launch.test_launch_slurm import node_script, run_script

    _islands_launch(tmp_path, capsys, "slurm")
    for name in "AB":
        launch = _island_launch(tmp_path, "slurm", name)
        for rel, text in sorted(_files(tmp_path, "slurm", name).items()):
            if not rel.endswith(".sbatch"):
                continue
            for body in (text, node_script(text)):
                check = subprocess.run(["bash", "-n"], input=body, capture_output=True, text=True, timeout=30)
                assert check.returncode == 0, (rel, check.stderr)
            work = tmp_path / "run" / name / rel.split("/")[0]
            work.mkdir(parents=True)
            proc = run_script(work, text)
            assert proc.returncode == 0, proc.stderr
            (folder,) = work.glob("hetauto-job-*-node*")
            assert LaunchPlan.load(folder / "launch.json") == launch


# ---------------------------------------------------------------------------------------------------- the join


def _node_job(tmp_path: Path, out: Path, island: str, site: str, node_rank: int) -> Any:
    from hetauto.launch.node import prepare_node

    return prepare_node(LaunchPlan.load(out / f"island-{island}" / "launch.json"), node_rank,
                        tmp_path / "work" / out.name / island / str(node_rank))


def test_the_join_refuses_a_node_of_another_island_or_island_launch(tmp_path: Path, capsys) -> None:
    from hetauto.launch.node_join import _differs, registration

    secret = tmp_path / "secret"
    secret.write_text("s" * 40)
    for h in (2, 3):
        _launch(capsys, str(pipelined_islands(tmp_path, h)), "--master", "10.0.0.1", "-o", str(tmp_path / f"h{h}"),
                "--secret-file", str(secret))
    lead = _node_job(tmp_path, tmp_path / "h2", "A", "a1", 0)
    mine = registration(lead)
    assert mine["island"]["name"] == "A" and mine["island"]["index"] == 0
    node = _node_job(tmp_path, tmp_path / "h2", "A", "a2", 1)  # the same island of the same launch: joins
    assert _differs(lead, 1, mine, registration(node)) is None
    sha = {h: json.loads((tmp_path / f"h{h}" / "island-launch.json").read_text())["island_plan_sha256"][:12]
           for h in (2, 3)}
    other_island = registration(_node_job(tmp_path, tmp_path / "h2", "B", "b2", 1))
    at_lead, at_node = _differs(lead, 1, mine, other_island)
    fix = "start every node of an island from that island's folder of the same hetauto launch output"
    assert at_lead == (f"node rank 1 (site 'a2', cluster 'a2' node 0) joined from host {other_island['host']} running "
                       f"island B (index 1) of island plan {sha[2]}, but this lead runs island A (index 0) of island "
                       f"plan {sha[2]}: {fix}")
    assert at_node == (f"node rank 1 (site 'a2', cluster 'a2' node 0): this node runs island B (index 1) of island "
                       f"plan {sha[2]}, but the lead (host {mine['host']}) runs island A (index 0) of island plan "
                       f"{sha[2]}: {fix}")
    other_launch = registration(_node_job(tmp_path, tmp_path / "h3", "A", "a2", 1))
    assert _differs(lead, 1, mine, other_launch)[0].startswith(
        f"node rank 1 (site 'a2', cluster 'a2' node 0) joined from host {other_launch['host']} running island A "
        f"(index 0) of island plan {sha[3]}, but this lead runs island A (index 0) of island plan {sha[2]}")


# ---------------------------------------------------------------------------------------------------- refusals

REFUSALS = [
    (["--master", "10.0.0.1", "--master", "A=10.0.0.2"],
     "--master: give one --master HOST[:PORT] (every island's lead on one host) or one --master ISLAND=HOST[:PORT] "
     "per island, not both (the plan's islands: A, B)"),
    (["--master", "A=10.0.0.1", "--master", "C=10.0.0.2"],
     "--master: 'C=10.0.0.2': 'C' is not an island of the plan (the plan's islands: A, B)"),
    (["--master", "A=10.0.0.1"], "--master: no lead address for island(s) B (give --master ISLAND=HOST[:PORT] for "
                                 "every island, or one --master HOST[:PORT] for all)"),
    (["--master", "10.0.0.1", "--master", "10.0.0.2"],
     "--master: given 2 times without an island name (give one --master HOST[:PORT], or --master ISLAND=HOST[:PORT] "
     "for every island)"),
    (["--master", "A=10.0.0.1", "--master", "B=10.0.0.1:29501"],
     "--master: 10.0.0.1:29501 is both island 'A''s control port and island 'B''s rendezvous port (give them "
     "different ports (one --master takes 3 ports per island))"),
    (["--master", "10.0.0.1", "--island-store", "10.0.0.1:29503"],
     "--island-store: 10.0.0.1:29503 is both island 'B''s rendezvous port and the outer store's port (give them "
     "different ports (one --master takes 3 ports per island))"),
    (["--master", "10.0.0.1", "--site", "x=a2,b1"],
     "--site: site 'x' holds clusters of islands A and B (each island is a launch of its own: name one site per "
     "island)"),
    (["--master", "10.0.0.1", "--env", "zz:K=V"], "--env: 'zz' is not a site (one of: a1, a2, b1, b2)"),
    (["--master", "10.0.0.1", "--target", "slurm", "--site-option", "b2.foo=1"],  # a target's refusal: its island
     "island B: slurm target: site 'b2': unknown site option 'foo'; known: partition, account, time, qos, constraint, "
     "mem, cpus-per-task, exclusive (KEY@CLUSTER: for one cluster's component)"),
    (["--master", "10.0.0.1", "--inject-fault", "rank=4,step=0"],
     "--inject-fault: rank 4 is outside the island plan's 4 ranks (island 0's ranks first, then island 1's, ...)"),
]


@pytest.mark.parametrize("flags, line", REFUSALS)
def test_what_an_island_launch_refuses(tmp_path: Path, capsys, flags: list[str], line: str) -> None:
    path = pipelined_islands(tmp_path)
    assert main(["launch", str(path), "-o", str(tmp_path / "out"), *flags]) != 0
    err = capsys.readouterr().err
    assert err == f"hetauto launch: error: {line}\n", err
    assert not (tmp_path / "out").exists()


def test_an_ordinary_plan_takes_one_master_and_no_island_store(tmp_path: Path, capsys) -> None:
    from hetauto.testing.two_sites import write_two_site_plan

    plan = write_two_site_plan(tmp_path, slow_ranks=2)
    for flags, line in ((["--master", "10.0.0.1", "--master", "10.0.0.2"],
                         "--master is given 2 times; a plan has one lead: give one --master (several are for an "
                         "island plan's islands)"),
                        (["--master", "10.0.0.1", "--island-store", "10.0.0.1:29502"],
                         "--island-store is the outer sync's store of an island plan (hetauto plan "
                         "--allow-local-sgd); this plan has none: drop --island-store")):
        assert main(["launch", str(plan), "-o", str(tmp_path / "out"), *flags]) != 0
        assert capsys.readouterr().err == f"hetauto launch: error: {line}\n"


def test_run_print_launch_of_an_island_plan_points_to_launch(tmp_path: Path, capsys) -> None:
    from hetauto.commands._island_run import PRINT_LAUNCH_REFUSAL

    assert main(["run", str(two_islands(tmp_path)), "--print-launch"]) != 0
    assert capsys.readouterr().err == f"hetauto run: error: {PRINT_LAUNCH_REFUSAL}\n"
    assert PRINT_LAUNCH_REFUSAL.startswith("hetauto run --print-launch prints one plan's scripts")

