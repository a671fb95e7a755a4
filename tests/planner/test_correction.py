"""The learned correction: improves held-out error on data with a known non-linearity, is deterministic,
persists only data (JSON/CSV), and loading never runs code."""

from __future__ import annotations

import json
import math
import pickle
import random

import pytest

from hetauto.core.errors import SpecError
from hetauto.core.model import ModelConfig
from hetauto.core.profile import get_device
from hetauto.planner.correction import (
    FEATURES, Correction, TrainingRow, analytical_row, read_rows, rows_from_profile,
)
from hetauto.planner.correction import _forest_x
from hetauto.planner.evaluate import Evaluator
from hetauto.planner.inputs import load_planning_inputs
from _correction_rows import biased_rows


def synthetic_rows(n: int, seed: int) -> list[TrainingRow]:
    """Ground truth = analytical x (1 + (3e7 / flops)^0.6): efficiency collapses for small GEMMs, which the
    analytical model's saturating curve underestimates; plus 2% noise."""
    rnd = random.Random(seed)
    dev = get_device("cpu")
    rows = []
    for _ in range(n):
        h = rnd.choice([32, 64, 128, 256])
        cfg = ModelConfig("syn", rnd.choice(["gpt", "llama"]), 4, h, 4, 4 * h, 256, max_seq_len=256)
        seq = rnd.choice([16, 32, 64, 128])
        mb = rnd.choice([1, 2, 4, 8])
        blocks = rnd.randint(1, 4)
        speed = rnd.choice([1.0, 0.5, 0.25])
        row = analytical_row(dev.scaled(speed), cfg, seq, (1, 1 + blocks), microbatch=mb,
                             measured_forward_s=1.0, measured_backward_s=1.0)
        flops = 10 ** row.features[FEATURES.index("log_flops")]
        g = 1 + (3e7 / flops) ** 0.6
        f = row.analytical_forward_s * g * rnd.uniform(0.98, 1.02)
        b = row.analytical_backward_s * g * 1.1 * rnd.uniform(0.98, 1.02)
        rows.append(TrainingRow(row.features, row.analytical_forward_s, row.analytical_backward_s, f, b, "syn"))
    return rows


def mape(pred: list[float], true: list[float]) -> float:
    return sum(abs(p - t) / t for p, t in zip(pred, true)) / len(true)


def test_forest_improves_held_out_error() -> None:
    train, test = synthetic_rows(300, 1), synthetic_rows(100, 2)
    corr = Correction.fit(train, seed=0)
    assert corr.trained and "300 measured stages" in corr.reason
    truth = [r.measured_forward_s + r.measured_backward_s for r in test]
    analytical = [r.analytical_forward_s + r.analytical_backward_s for r in test]
    corrected = []
    for r in test:
        rf, rb = corr.ratios(r.features, (r.analytical_forward_s, r.analytical_backward_s))
        corrected.append(r.analytical_forward_s * rf + r.analytical_backward_s * rb)
    assert mape(analytical, truth) > 0.3
    assert mape(corrected, truth) < 0.1
    assert mape(corrected, truth) < mape(analytical, truth) / 3


def test_deterministic_for_a_seed_and_matches_sklearn() -> None:
    rows = synthetic_rows(120, 3)
    a, b, c = Correction.fit(rows, seed=5), Correction.fit(rows, seed=5), Correction.fit(rows, seed=6)
    probe = synthetic_rows(20, 4)
    pa = [a.log_ratios(r.features) for r in probe]
    assert pa == [b.log_ratios(r.features) for r in probe]
    assert pa != [c.log_ratios(r.features) for r in probe]
    sk = a._sklearn.predict([_forest_x(r.features) for r in probe])  # type: ignore[attr-defined]
    for r, (f, bk), (sf, sb) in zip(probe, pa, sk):
        bf, bb = a._base_log(r.features, 10 ** r.features[FEATURES.index("log_analytical_s")],
                             2 * 10 ** r.features[FEATURES.index("log_analytical_s")])
        assert f - bf == pytest.approx(sf, abs=1e-12) and bk - bb == pytest.approx(sb, abs=1e-12)


def test_no_data_falls_back_to_analytical_and_says_so() -> None:
    corr = Correction.fit([])
    assert not corr.trained and corr.ratios((0.0,) * len(FEATURES)) == (1.0, 1.0)
    assert corr.reason == "only 0 training rows (need >= 4): analytical model only"
    inp = load_planning_inputs(scenario="cpu-demo")
    assert Evaluator(inp, correction=corr).cost_model_name == "analytical"


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_save_load_round_trip_refits_identically(tmp_path, suffix: str, monkeypatch) -> None:
    rows = synthetic_rows(60, 5)
    corr = Correction.fit(rows, {"n_estimators": 20}, seed=3)
    path = corr.save(tmp_path / f"train{suffix}")

    def boom(*_a, **_k):  # loading must never unpickle
        raise AssertionError("pickle used")

    monkeypatch.setattr(pickle, "loads", boom)
    monkeypatch.setattr(pickle, "load", boom)
    back = Correction.load(path)
    assert back.rows == corr.rows and back.hyperparameters == corr.hyperparameters
    probe = synthetic_rows(10, 6)
    assert [back.log_ratios(r.features) for r in probe] == [corr.log_ratios(r.features) for r in probe]


def test_loading_never_executes_code(tmp_path) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps(eval)  # a real pickle: would run code if unpickled
    bad = tmp_path / "t.json"
    bad.write_bytes(payload)
    with pytest.raises(SpecError, match=r"t.json: .*(invalid JSON|cannot read)"):
        Correction.load(bad)
    doc = {"rows": [{"features": [f"__import__('os').system('touch {marker}')"] + [0] * (len(FEATURES) - 1),
                     "analytical_forward_s": 1, "analytical_backward_s": 1, "measured_forward_s": 1,
                     "measured_backward_s": 1}]}
    bad.write_text(json.dumps(doc))
    with pytest.raises(SpecError, match=r"rows\[0\]\.features\[0\]: expected a number"):
        Correction.load(bad)
    csv_bad = tmp_path / "t.csv"
    csv_bad.write_text("# n_estimators=__import__('os')\n" + ",".join(FEATURES) + "\n")
    with pytest.raises(SpecError, match="missing column"):
        Correction.load(csv_bad)
    rows = synthetic_rows(5, 1)
    good = Correction.fit(rows).save(tmp_path / "g.csv")
    good.write_text(good.read_text().replace("# n_estimators=80", "# n_estimators=__import__('os')"))
    with pytest.raises(SpecError, match=r"hyperparameters.n_estimators: expected a number"):
        Correction.load(good)
    assert not marker.exists()


def test_bad_rows_name_the_field(tmp_path) -> None:
    row = {"features": [1.0] * len(FEATURES), "analytical_forward_s": 1, "analytical_backward_s": 1,
           "measured_forward_s": -2, "measured_backward_s": 1}
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"rows": [row]}))
    with pytest.raises(SpecError, match=r"r.json: rows\[0\].measured_forward_s: expected a positive finite number"):
        read_rows(p)
    p.write_text(json.dumps({"rows": [], "hyperparameters": {"depth": 3}}))
    with pytest.raises(SpecError, match=r"hyperparameters.depth: unknown hyper-parameter"):
        read_rows(p)


def test_evaluator_applies_the_correction() -> None:
    inp = load_planning_inputs(scenario="cpu-demo")
    corr = Correction.fit(biased_rows([inp.cluster.clusters[0].device], inp.model, inp.seq_len))
    plain, fixed = Evaluator(inp), Evaluator(inp, correction=corr)
    assert fixed.cost_model_name == "analytical+forest"
    f0, b0 = plain.stage_compute_time("fast", (0, 3), 1, 1, 4)
    f1, b1 = fixed.stage_compute_time("fast", (0, 3), 1, 1, 4)
    assert f1 == pytest.approx(3 * f0, rel=1e-9) and b1 == pytest.approx(2 * b0, rel=1e-9)


def test_rows_from_profile_samples() -> None:
    from hetauto.core.profile import LayerSample, MeasuredDoc

    dev = get_device("cpu")
    from dataclasses import replace

    sample = LayerSample(microbatch=2, seq_len=32, hidden=64, num_heads=4, forward_s=0.01, backward_s=0.02)
    prof = replace(dev, measured=MeasuredDoc(samples=(sample,)))
    rows = rows_from_profile(prof)
    assert len(rows) == 1 and rows[0].measured_forward_s == 0.01 and rows[0].source == "cpu:samples[0]"
    assert rows[0].features[FEATURES.index("blocks")] == 1.0 and math.isfinite(rows[0].analytical_forward_s)


def test_plan_stage_features_equal_training_features() -> None:
    """A stage scored by the Evaluator gets exactly the features a measured row of the same stage has, so the
    forest is applied to what it was trained on."""
    inp = load_planning_inputs(scenario="cpu-demo")
    ev = Evaluator(inp)
    cluster = inp.cluster["slow"]
    for layers in ((0, 3), (2, 4), (3, 6)):
        d = ev.stage_detail("slow", layers, 1, 1, 4)
        got = Correction().features_for(cluster, inp, layers, 1, 1, 4, False, d)
        row = analytical_row(cluster.device, inp.model, inp.seq_len, layers, microbatch=4, measured_forward_s=1.0,
                             measured_backward_s=1.0)
        assert got == row.features
        assert (row.analytical_forward_s, row.analytical_backward_s) == (d.fwd_compute_s, d.bwd_compute_s)


def test_correction_leaves_unmeasured_devices_alone() -> None:
    """Rows measured on CPUs do not rescale an H800 stage: outside the measured speed range the ratio is 1."""
    corr = Correction.fit(synthetic_rows(60, 8))
    inp = load_planning_inputs(scenario="mixed-small")
    plain, fixed = Evaluator(inp), Evaluator(inp, correction=corr)
    assert fixed.stage_compute_time("a100", (1, 5), 1, 1, 2) == plain.stage_compute_time("a100", (1, 5), 1, 1, 2)
    cpu_row = synthetic_rows(1, 9)[0]
    assert corr.covers(cpu_row.features)


def test_shipped_rows_load_and_cover_cpu_only() -> None:
    from hetauto.planner.correction import default_correction, shipped_training_files

    files = shipped_training_files()
    assert [f.name for f in files] == ["cpu-stages.csv"]
    corr = default_correction()
    assert corr.trained and len(corr.rows) >= 100
    inp = load_planning_inputs(scenario="cpu-demo")
    ev = Evaluator(inp, correction=corr)
    assert ev.cost_model_name == "analytical+forest"
    assert ev.stage_compute_time("fast", (0, 3), 1, 1, 4) != Evaluator(inp).stage_compute_time("fast", (0, 3), 1, 1, 4)
    h800 = load_planning_inputs(scenario="paper-4c")
    corrected = Evaluator(h800, correction=corr).stage_compute_time("h800", (1, 5), 8, 1, 1)
    assert corrected == Evaluator(h800).stage_compute_time("h800", (1, 5), 8, 1, 1)


def two_profile_rows(n: int, seed: int) -> tuple[list[TrainingRow], list[TrainingRow]]:
    """The same synthetic measurements against two profiles of the same hardware: the catalog `cpu` guess and a
    'measured' one (13x lower peak, 7x lower bandwidth), as cost_model_accuracy.py makes them."""
    from dataclasses import replace

    cat = get_device("cpu")
    loc = replace(cat, peak_flops=cat.peak_flops / 13, memory_bandwidth_Bps=cat.memory_bandwidth_Bps / 7)
    a, b = [], []
    for r in synthetic_rows(n, seed):
        speed = 10 ** (r.features[FEATURES.index("log_peak_flops")] - math.log10(cat.peak_flops))
        cfg = ModelConfig("syn", "llama" if r.features[FEATURES.index("is_llama")] else "gpt", 4,
                          int(r.features[FEATURES.index("hidden")]), 4, 4 * int(r.features[FEATURES.index("hidden")]),
                          256, max_seq_len=256)
        blocks = int(r.features[FEATURES.index("blocks")])
        row = analytical_row(loc.scaled(speed), cfg, int(r.features[FEATURES.index("seq_len")]), (1, 1 + blocks),
                             microbatch=int(r.features[FEATURES.index("samples_per_replica")]),
                             measured_forward_s=r.measured_forward_s, measured_backward_s=r.measured_backward_s)
        assert row.features[FEATURES.index("log_flops")] == r.features[FEATURES.index("log_flops")]
        a.append(r)
        b.append(row)
    return a, b


def test_two_profiles_of_the_same_hardware_do_not_interfere() -> None:
    """Rows against the catalog profile and against a measured profile of the same machine (same seconds,
    different peaks) fit together as well as each family alone: the base is fitted per profile family."""
    train_cat, train_loc = two_profile_rows(300, 11)
    test_cat, test_loc = two_profile_rows(100, 12)

    def err(corr: Correction, rows: list[TrainingRow]) -> float:
        pred = []
        for r in rows:
            rf, rb = corr.ratios(r.features, (r.analytical_forward_s, r.analytical_backward_s))
            pred.append(r.analytical_forward_s * rf + r.analytical_backward_s * rb)
        return mape(pred, [r.measured_forward_s + r.measured_backward_s for r in rows])

    both = Correction.fit(train_cat + train_loc, seed=0)
    assert len(both._bases) == 2
    alone_cat, alone_loc = Correction.fit(train_cat, seed=0), Correction.fit(train_loc, seed=0)
    assert err(both, test_cat) < 0.1 and err(both, test_loc) < 0.1
    assert err(both, test_cat) < 1.1 * err(alone_cat, test_cat)
    assert err(both, test_loc) < 1.1 * err(alone_loc, test_loc)
    # the same measurement seen through either profile gets the same prediction (a pooled base: up to 25% apart)
    def seconds(r: TrainingRow) -> float:
        a = (r.analytical_forward_s, r.analytical_backward_s)
        return sum(x * y for x, y in zip(a, both.ratios(r.features, a)))

    apart = [abs(seconds(c) / seconds(loc) - 1) for c, loc in zip(test_cat, test_loc)]
    assert max(apart) < 0.03 and sum(apart) / len(apart) < 0.01
