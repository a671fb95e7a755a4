"""A closed stdout ends a command with 141 and leaves nothing behind in the process: rich's console went quiet for
the closed pipe, and a later command in the same process (the API, a test) printed nothing at all."""

from __future__ import annotations

import io
import sys

import pytest

from hetauto.cli import main


class _ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_command_after_a_closed_pipe_still_prints(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--scenario", "cpu-demo", "--iterations", "1", "--max-evaluations", "5"]
    with monkeypatch.context() as m:
        m.setattr(sys, "stdout", _ClosedPipe())
        assert main(argv) == 141
    capsys.readouterr()
    assert main(argv) == 0
    assert "cpu-demo" in capsys.readouterr().out
