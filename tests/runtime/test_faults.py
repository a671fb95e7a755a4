"""Fault injection: the spec parser (one-line errors), the environment hook, and a real kill with os._exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from hetauto.core.errors import SpecError
from hetauto.runtime import faults
from hetauto.runtime.faults import FAULT_ENV, FAULT_EXIT_CODE, FaultSpec


@pytest.fixture(autouse=True)
def no_fault():
    faults.install(None)
    yield
    faults.install(None)


def test_parse_minimal_and_full() -> None:
    assert FaultSpec.parse("rank=3,step=7") == FaultSpec(3, 7, "step", "exit")
    assert FaultSpec.parse(" step=0 , rank=1 ,phase=checkpoint,action=hang") == FaultSpec(1, 0, "checkpoint", "hang")
    assert str(FaultSpec(1, 2)) == "rank=1,step=2,phase=step,action=exit"
    assert FaultSpec.parse(str(FaultSpec(4, 5, "checkpoint"))) == FaultSpec(4, 5, "checkpoint")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "--inject-fault: rank: missing (use rank=R,step=S[,phase=step|checkpoint][,action=exit|hang|sigkill|sigbus|emfile|oom])"),
        ("rank=1", "--inject-fault: step: missing (use rank=R,step=S[,phase=step|checkpoint][,action=exit|hang|sigkill|sigbus|emfile|oom])"),
        ("rank=-1,step=2", "--inject-fault: rank: '-1' is not a non-negative integer (use rank=R,step=S[,phase=step|checkpoint][,action=exit|hang|sigkill|sigbus|emfile|oom])"),
        ("rank=1,step=x", "--inject-fault: step: 'x' is not a non-negative integer (use rank=R,step=S[,phase=step|checkpoint][,action=exit|hang|sigkill|sigbus|emfile|oom])"),
        ("rank=1,step=2,phase=forward", "--inject-fault: phase: 'forward' is not one of step, checkpoint (use rank=R,step=S[,phase=step|checkpoint][,action=exit|hang|sigkill|sigbus|emfile|oom])"),
        ("rank=1,step=2,action=boom", "--inject-fault: action: 'boom' is not one of exit, hang, sigkill, sigbus, emfile, oom (use rank=R,step=S[,phase=step|checkpoint][,action=exit|hang|sigkill|sigbus|emfile|oom])"),
        ("rank=1,rank=2,step=2", "--inject-fault: rank: given twice (use rank=R,step=S[,phase=step|checkpoint][,action=exit|hang|sigkill|sigbus|emfile|oom])"),
        ("rank=1,step=2,node=3", "--inject-fault: node: unknown key (use rank=R,step=S[,phase=step|checkpoint][,action=exit|hang|sigkill|sigbus|emfile|oom])"),
        ("rank 1", "--inject-fault: 'rank 1' is not key=value (use rank=R,step=S[,phase=step|checkpoint][,action=exit|hang|sigkill|sigbus|emfile|oom])"),
        ("rank=١,step=2", "--inject-fault: rank: '١' is not a non-negative integer (use rank=R,step=S[,phase=step|checkpoint][,action=exit|hang|sigkill|sigbus|emfile|oom])"),
    ],
)
def test_bad_specs_are_one_line_spec_errors(text: str, message: str) -> None:
    with pytest.raises(SpecError) as err:
        FaultSpec.parse(text)
    assert str(err.value) == message


def test_install_from_env_and_matching() -> None:
    assert faults.install_from_env({}) is None and faults.installed() is None
    spec = faults.install_from_env({FAULT_ENV: "rank=2,step=5,phase=checkpoint"})
    assert spec == faults.installed() == FaultSpec(2, 5, "checkpoint")
    with pytest.raises(SpecError, match=f"^{FAULT_ENV}: step: missing"):
        faults.install_from_env({FAULT_ENV: "rank=2"})
    # non-matching rank / step / phase: nothing happens (the test process survives)
    faults.maybe_fail(5, "step", rank=2)
    faults.maybe_fail(5, "checkpoint", rank=1)
    faults.maybe_fail(4, "checkpoint", rank=2)


def _run(code: str, env_fault: str) -> subprocess.CompletedProcess:
    import os

    env = dict(os.environ, **{FAULT_ENV: env_fault, "RANK": "1", "PYTHONPATH": os.getcwd()})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=60)


def test_matching_step_kills_the_process_at_once_without_cleanup() -> None:
    code = """
        import atexit, sys
        from hetauto.runtime import faults
        atexit.register(lambda: print("atexit ran"))
        faults.install_from_env()
        for step in range(5):
            print("step", step, flush=True)
            faults.maybe_fail(step)
        print("finished")
    """
    proc = _run(code, "rank=1,step=2")
    assert proc.returncode == FAULT_EXIT_CODE
    assert proc.stdout.split("\n") == ["step 0", "step 1", "step 2", ""]  # no "finished", no atexit
    assert proc.stderr == "hetauto: injected fault (rank=1,step=2,phase=step,action=exit): rank 1 stops at step 2 (step)\n"
    # another rank (RANK=1 in the child, the fault names rank 0) runs to the end
    assert _run(code, "rank=0,step=2").stdout.endswith("finished\natexit ran\n")
