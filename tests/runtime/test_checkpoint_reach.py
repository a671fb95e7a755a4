"""The checkpoint folder is checked on every rank before the first step: written by all, the same for all."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetauto.core.comm import Communicator
from hetauto.testing.multiproc import run_ranks

pytestmark = pytest.mark.multiprocess


def _check(rank: int, world: int, folders: list[str]) -> str:
    from hetauto.runtime.checkpoint_reach import check_checkpoint_folder

    comm = Communicator.init_from_env("gloo", timeout_s=20)
    try:
        check_checkpoint_folder(comm, folders[rank])
        return "ok"
    except Exception as exc:  # noqa: BLE001 - the test reads which rank raised what
        return f"{type(exc).__name__}: {exc}"
    finally:
        comm.destroy()


def test_shared_writable_folder_passes_and_leaves_nothing(tmp_path):
    folder = tmp_path / "ck" / "new"
    assert run_ranks(_check, 2, [str(folder)] * 2) == ["ok", "ok"]
    assert folder.is_dir() and list(folder.iterdir()) == []


def test_a_folder_one_rank_cannot_write_names_that_rank(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    out = run_ranks(_check, 2, [str(tmp_path / "ck"), str(blocker / "ck")])
    assert out[0] == "PeerFailed: rank(s) 1 cannot use the checkpoint folder (their own error says why)"
    assert out[1].startswith(f"CheckpointFolderUnreachable: cannot write the checkpoint folder '{blocker / 'ck'}' on "
                             "host ")
    assert out[1].endswith(": NotADirectoryError: Not a directory; checkpoints need one folder every rank can "
                           "write, the same on every node (a shared file system mounted at the same absolute path); "
                           "pass such a --checkpoint-dir")


def test_a_folder_local_to_one_node_is_named(tmp_path):
    """Two ranks whose paths lead to two folders: what a node-local disk or a relative path at two sites does."""
    out = run_ranks(_check, 2, [str(tmp_path / "site0" / "ck"), str(tmp_path / "site1" / "ck")])
    assert out[0].startswith("PeerFailed: rank(s) 1 cannot use")
    assert out[1].startswith("CheckpointFolderUnreachable: on host ")
    assert f"the checkpoint folder '{tmp_path / 'site1' / 'ck'}' is not the folder rank 0 writes" in out[1]
    assert not list(Path(tmp_path / "site0" / "ck").iterdir())
