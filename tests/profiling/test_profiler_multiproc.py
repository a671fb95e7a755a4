"""Multi-rank profiling for real: gloo processes measure all-reduce, all-gather and point-to-point and fit
alpha/beta; TP=2 block samples run sharded over a DeviceMesh; the CLI path under a torchrun-like
environment writes the file from rank 0 only."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hetauto.testing.multiproc import run_ranks

pytestmark = pytest.mark.multiprocess


def _profile_rank(rank: int, world: int) -> dict[str, object]:
    from hetauto.backends import select_backend
    from hetauto.profiling.layers import LayerPoint
    from hetauto.profiling.runner import ProfileOptions, run_profile

    grid = (LayerPoint(1, 16, 64, 1), LayerPoint(2, 16, 128, 1), LayerPoint(2, 16, 128, 2))
    options = ProfileOptions(quick=True, gemm=False, memory_bandwidth=False, samples=True, layer_grid=grid,
                             message_sizes=(2**12, 2**18, 2**24), timeout_s=30, progress=False)
    run = run_profile(select_backend("cpu"), options)
    m = run.profile.measured
    assert m is not None
    return {"rank": run.rank, "world": run.world_size, "collectives": m.collectives.model_dump(),
            "samples": [s.model_dump() for s in m.samples]}


def test_two_rank_gloo_fits_and_tp_samples() -> None:
    out = run_ranks(_profile_rank, 2, timeout=90)
    assert [o["rank"] for o in out] == [0, 1] and all(o["world"] == 2 for o in out)
    c0, c1 = out[0]["collectives"], out[1]["collectives"]
    for name in ("all_reduce", "all_gather", "p2p"):
        fit = c0[name]  # type: ignore[index]
        assert fit["alpha_s"] >= 0 and fit["beta_s_per_byte"] > 0, (name, fit)
        assert len(fit["points"]) == 3
    assert [p[0] for p in c0["all_reduce"]["points"]] == [2**12, 2**18, 2**24]  # type: ignore[index]
    assert [p[0] for p in c0["all_gather"]["points"]] == [2 * 2**12, 2 * 2**18, 2 * 2**24]  # type: ignore[index]
    assert c0["all_reduce"] == c1["all_reduce"] and c0["all_gather"] == c1["all_gather"]  # type: ignore[index]
    assert c1["p2p"] is None  # type: ignore[index]
    for o in out:
        rows = o["samples"]
        assert [(r["tp"], r["hidden"], r["microbatch"]) for r in rows] == [(1, 64, 1), (1, 128, 2), (2, 128, 2)]  # type: ignore[union-attr,index]
        assert all(r["forward_s"] > 0 and r["backward_s"] > 0 and r["memory_bytes"] > 0 for r in rows)  # type: ignore[union-attr,index]
    tp1, tp2 = out[0]["samples"][1], out[0]["samples"][2]  # type: ignore[index]
    assert tp2["num_heads"] == 2 and tp2["ffn_hidden"] == 512
    # A TP rank keeps only its shard of the q/k/v and 4h-wide MLP activations for backward.
    assert tp2["memory_bytes"] < tp1["memory_bytes"]


def _cli_rank(rank: int, world: int, path: str) -> tuple[int, str]:
    import contextlib
    import io

    from hetauto.backends import reset_registry
    from hetauto.cli import main

    reset_registry()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["profile", "--quick", "--dtypes", "fp32", "-o", path, "--json", "--timeout", "30"])
    return code, buf.getvalue()


def test_two_rank_cli_on_mock_backend(tmp_path: Path) -> None:
    from hetauto.core.profile import load_profile

    path = tmp_path / "mock.json"
    env = {"HETAUTO_BACKEND": "mock", "HETAUTO_MOCK_DEVICES": "2", "HETAUTO_MOCK_PROFILE": "a100-80g",
           "HETAUTO_MOCK_SPEED": "0.5"}
    (code0, out0), (code1, out1) = run_ranks(_cli_rank, 2, str(path), timeout=90, env=env)
    assert (code0, code1) == (0, 0) and out1 == ""  # only rank 0 prints
    doc = json.loads(out0)
    prof = load_profile(path)
    assert prof.to_document() == doc
    assert prof.key == "a100-80g" and prof.backend == "mock"
    assert prof.peak_flops == 0.5 * 312e12  # trusted catalog peak kept, scaled by the mock speed factor
    assert prof.memory_bandwidth_Bps == pytest.approx(0.5 * float(prof.measured.memory_bandwidth))  # type: ignore[union-attr,arg-type]
    assert 0 < prof.efficiency_model.max_eff < 1
    fits = prof.measured.collectives  # type: ignore[union-attr]
    for fit in (fits.all_reduce, fits.all_gather, fits.p2p):
        # a loaded 2-core host can flatten the slope to 0 (the fit clamps at 0), never below
        assert fit is not None and fit.alpha_s >= 0 and fit.beta_s_per_byte >= 0 and fit.world_size == 2
        assert len(fit.points) >= 3
    assert not os.path.exists(tmp_path / "profile-a100-80g.yaml")
