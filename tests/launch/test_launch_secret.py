"""A job across sites refuses strangers (issue 41 item 2): `hetauto launch` writes one job secret per launch
(control.secret, 0600, beside launch.json and in each site's folder; never in launch.json or a script), the lead's
control store requires it, every agent's and rank's connection proves it; a stranger is refused with one line on the
lead and changes nothing; a node of another launch is refused at join in one line, exit 1."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from hetauto.cli import main
from hetauto.core.control_store import ControlStoreClient
from hetauto.core.errors import HetautoError
from hetauto.launch.control import ControlServer
from hetauto.launch.node import RefusedByLead, prepare_node
from hetauto.launch.node_end import ABORT_KEY
from hetauto.launch.node_join import member_join
from hetauto.launch.node_secret import SECRET_DIFFERS, SECRET_FILE_ENV, find_secret, new_secret
from hetauto.launch.plan import LaunchPlan
from hetauto.testing.multiproc import two_free_ports
from hetauto.testing.two_sites import await_first_step, write_two_site_plan, written_sites_running

SECRET = "ab" * 32


def _launch(root: Path, port: int, *extra: str, name: str = "launch") -> Path:
    if not (root / "plan").exists():
        (root / "plan").mkdir()
        write_two_site_plan(root / "plan", slow_ranks=1)
    out = root / name
    assert main(["launch", str(root / "plan" / "plan.json"), "--master", f"127.0.0.1:{port}", "-o", str(out),
                 "--no-reference", "--join-timeout", "30", "--timeout", "30", *extra]) == 0
    return out


def test_launch_writes_one_owner_only_secret_per_launch_and_never_in_its_text(tmp_path: Path) -> None:
    out = _launch(tmp_path, 29500)
    homes = [out / "control.secret", out / "fast" / "control.secret", out / "slow" / "control.secret"]
    secrets = {p.read_text() for p in homes}
    assert len(secrets) == 1 and len(bytes.fromhex(secrets.pop().strip())) == 32
    assert all(stat.S_IMODE(os.stat(p).st_mode) == 0o600 for p in homes)
    secret = homes[0].read_text().strip()
    for path in out.rglob("*"):
        if path.is_file() and path.name != "control.secret":
            assert secret not in path.read_text(), path
    script = (out / "slow" / "node1.sh").read_text()
    assert f'{SECRET_FILE_ENV}="${{{SECRET_FILE_ENV}:-$(cd' in script and "/control.secret}" in script
    other = _launch(tmp_path, 29500, name="other")
    assert (other / "control.secret").read_text().strip() != secret  # a new secret per launch
    shared = _launch(tmp_path, 29500, "--secret-file", str(homes[0]), name="shared")
    assert (shared / "slow" / "control.secret").read_text().strip() == secret


def test_a_bad_secret_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "short").write_text("abc\n")
    for given, said in ((tmp_path / "none", "no such file"), (tmp_path / "short", "not a job secret")):
        (tmp_path / "plan").mkdir(exist_ok=True)
        plan = write_two_site_plan(tmp_path / "plan", slow_ranks=1)
        assert main(["launch", str(plan), "--master", "127.0.0.1", "-o", str(tmp_path / "o"),
                     "--secret-file", str(given)]) != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"--secret-file {given}: {said}" in err[0], err
    assert not (tmp_path / "o").exists()


def test_the_agent_finds_its_secret_given_then_named_then_beside_the_launch(tmp_path: Path) -> None:
    launch = tmp_path / "launch.json"
    for name, text in (("given", "1" * 64), ("named", "2" * 64), ("control.secret", "3" * 64)):
        (tmp_path / name).write_text(text + "\n")
    assert find_secret(launch, str(tmp_path / "given"), {SECRET_FILE_ENV: str(tmp_path / "named")}) == "1" * 64
    assert find_secret(launch, None, {SECRET_FILE_ENV: str(tmp_path / "named")}) == "2" * 64
    assert find_secret(launch, None, {}) == "3" * 64
    with pytest.raises(HetautoError, match=r"^no job secret: .*control.secret does not exist; give --secret-file"):
        find_secret(tmp_path / "elsewhere" / "launch.json", None, {})


def test_a_stranger_is_refused_with_one_line_and_changes_nothing(tmp_path: Path) -> None:
    said: list[str] = []
    with ControlServer(tmp_path / "run", token=SECRET, on_refused=said.append) as control:
        port = control.port
        for token in (None, "cd" * 32, None):
            with pytest.raises(PermissionError):
                ControlStoreClient("127.0.0.1", port, timeout_s=5, token=token).set(ABORT_KEY, "stranger")
        time.sleep(0.2)
        assert control.get(ABORT_KEY) is None
        assert ControlStoreClient("127.0.0.1", port, timeout_s=5, token=SECRET).add("x", 1) == 1
    assert len(said) == 1 and said[0].startswith("127.0.0.1:"), said  # one line per stranger's host


def test_a_node_of_another_launch_is_refused_at_join_saying_so(tmp_path: Path) -> None:
    launch = LaunchPlan.load(_launch(tmp_path, two_free_ports()) / "launch.json")
    job = prepare_node(launch, 1, tmp_path / "member", secret=new_secret())
    with ControlServer(tmp_path / "lead", bind="127.0.0.1", port=launch.rendezvous.control_port, token=SECRET):
        started = time.monotonic()
        with pytest.raises(RefusedByLead) as err:
            member_join(job, 300.0, lambda _: None)
    assert time.monotonic() - started < 150  # at once: well before the join timeout (300 s), whatever the load
    assert str(err.value) == f"node rank 1 (site 'slow', cluster 'slow' node 0): {SECRET_DIFFERS}"
    assert err.value.exit_code == 1


@pytest.mark.multiprocess
@pytest.mark.timeout(150)
def test_a_stranger_on_a_running_leads_port_is_refused_and_the_job_trains_on(tmp_path: Path) -> None:
    """Real agents started from the scripts `hetauto launch` wrote (loopback, the two-site plan's 1 + 1 ranks)."""
    port = two_free_ports()
    out = _launch(tmp_path, port, "--steps", "40")
    with written_sites_running(out, tmp_path) as procs:
        await_first_step(tmp_path / "node0", procs[0], 90)
        for token, attempt in ((None, lambda c: c.set(ABORT_KEY, "FAKE-ABORT")), ("cd" * 32, lambda c: c.get("x")),
                               (None, lambda c: c.post("hetauto/seq", "hetauto/msg/", '{"rank": 0}'))):
            with pytest.raises(PermissionError):
                attempt(ControlStoreClient("127.0.0.1", port + 1, timeout_s=5, token=token))
        errs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], f"{errs[0][-2000:]}\n{errs[1][-2000:]}"
    refused = [line for line in errs[0].splitlines() if "refused a connection to the control store" in line]
    assert len(refused) == 1 and refused[0].startswith("hetauto node 0: refused a connection to the control store "
                                                       "from 127.0.0.1:"), errs[0][-2000:]
    assert "FAKE-ABORT" not in errs[0] + errs[1]


def test_a_site_s_env_may_name_the_secret_file_and_an_agent_without_one_says_so(tmp_path: Path,
                                                                              capsys: pytest.CaptureFixture) -> None:
    """A Kubernetes Secret mounted as a file: `--env HETAUTO_SECRET_FILE=PATH` at launch names it for the agent."""
    (tmp_path / "mounted").write_text(SECRET + "\n")
    out = _launch(tmp_path, 29500, "--env", f"{SECRET_FILE_ENV}={tmp_path / 'mounted'}")
    assert SECRET not in (out / "launch.json").read_text()
    (out / "control.secret").unlink()
    launch = LaunchPlan.load(out / "launch.json")
    job = prepare_node(launch, 1, tmp_path / "member")
    assert find_secret(out / "launch.json", None, job.env) == SECRET
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "launch.json").write_text((tmp_path / "launch" / "launch.json").read_text().replace(
        str(tmp_path / "mounted"), str(tmp_path / "gone")))
    assert main(["node", str(bare / "launch.json"), "--node-rank", "1", "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"hetauto node: error: {SECRET_FILE_ENV} {tmp_path / 'gone'}: no such file; give the job's "
                       "control.secret (hetauto launch wrote it beside launch.json and in each site's folder)"), err
