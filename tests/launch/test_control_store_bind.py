"""The lead's stores listen on the address the launch names, not on every interface (issue 41 item 2).

127.0.0.2 and 127.0.0.1 are two addresses of this host (lo holds 127/8): a store bound to one refuses a connection
to the other, no namespaces needed. Checked for the control store, for torchrun's rendezvous store through the
launcher's bound-socket prefix, and for real node agents launched with `--master 127.0.0.2`."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hetauto.cli import main
from hetauto.core.control_store import ControlStoreClient
from hetauto.core.errors import HetautoError
from hetauto.launch.control import ControlServer
from hetauto.launch.listen_address import interface_addresses, lead_listen_address
from hetauto.launch.local import torchrun_launcher
from hetauto.testing.multiproc import two_free_ports
from hetauto.testing.two_sites import await_first_step, write_two_site_plan, written_sites_running

SECRET = "ab" * 32
BOUND, OTHER = "127.0.0.2", "127.0.0.1"


def _refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_the_control_store_bound_to_one_address_refuses_a_connection_to_another(tmp_path: Path) -> None:
    with ControlServer(tmp_path / "run", bind=BOUND, token=SECRET) as control:
        assert _refused(OTHER, control.port)
        assert ControlStoreClient(BOUND, control.port, timeout_s=5, token=SECRET).add("x", 1) == 1


def test_the_listen_address_is_the_master_when_it_is_this_hosts_else_the_iface_else_every_interface() -> None:
    assert lead_listen_address(BOUND, None).bind == BOUND and lead_listen_address(BOUND, None).note is None
    assert lead_listen_address("localhost", None).bind == "127.0.0.1"
    assert lead_listen_address(BOUND, "nosuchif0").bind == BOUND  # the master is this host's: it wins
    assert interface_addresses("lo")[:1] == ["127.0.0.1"] and interface_addresses("nosuchif0") == []
    nat = "203.0.113.7"  # TEST-NET-3: an address no interface here holds (a master behind NAT)
    assert lead_listen_address(nat, "lo").bind == "127.0.0.1"
    wide = lead_listen_address(nat, None, "fast")
    assert wide.bind == "0.0.0.0" and wide.note == (
        "note: the control store listens on every interface: the master address 203.0.113.7 is not an address of "
        "this host (behind NAT?); launch with --iface fast=IFNAME to listen on one")
    with pytest.raises(HetautoError, match=r"^--iface nosuchif0: this host has no interface 'nosuchif0' with an "):
        lead_listen_address(nat, "nosuchif0")


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_torchruns_store_listens_only_where_the_launcher_binds_it() -> None:
    """The prefix torchrun runs under (torchrun_launcher(bind)) hands its TCPStore a socket bound there."""
    prefix = torchrun_launcher(BOUND)[2].split("import os, runpy")[0]
    probe = prefix + ("store = _dist.TCPStore(%r, 0, 1, True, wait_for_workers=False)\n"
                      "print(store.port, flush=True)\nimport sys\nsys.stdin.read()\n" % BOUND)
    proc = subprocess.Popen([sys.executable, "-c", probe], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())  # type: ignore[union-attr]
        assert _refused(OTHER, port)
        socket.create_connection((BOUND, port), timeout=5).close()
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_a_lead_launched_on_one_address_serves_only_there_and_the_job_trains(tmp_path: Path) -> None:
    """Real agents from the scripts `hetauto launch --master 127.0.0.2:PORT` wrote (the two-site plan, 1 + 1
    ranks): while they train, the control and rendezvous ports refuse 127.0.0.1; the job ends 0 on both nodes."""
    port = two_free_ports()
    (tmp_path / "plan").mkdir()
    write_two_site_plan(tmp_path / "plan", slow_ranks=1)
    out = tmp_path / "launch"
    assert main(["launch", str(tmp_path / "plan" / "plan.json"), "--master", f"{BOUND}:{port}", "-o", str(out),
                 "--no-reference", "--join-timeout", "30", "--timeout", "30", "--steps", "40"]) == 0
    with written_sites_running(out, tmp_path) as procs:
        await_first_step(tmp_path / "node0", procs[0], 120)
        assert _refused(OTHER, port + 1) and _refused(OTHER, port)  # the control store, torchrun's rendezvous
        errs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], f"{errs[0][-2000:]}\n{errs[1][-2000:]}"
    assert "listens on every interface" not in errs[0]
