"""`hetauto profile import --from metis|csv`: the real Metis sample files and a documented CSV into a profile
whose measured layer rows the Evaluator reads; CSV errors name the file, line, column and fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetauto.cli import main
from hetauto.core.errors import SpecError
from hetauto.core.profile import load_profile
from hetauto.interop.layer_csv import read_layer_csv

REAL = Path(__file__).parents[1] / "data" / "metis"
HEADER = "device,kind,tp,microbatch,seq_len,precision,fwd_ms,bwd_ms,mem_mb,model\n"


def test_import_the_real_metis_files_prints_rows(tmp_path, capsys) -> None:
    out = tmp_path / "a100.yaml"
    files = [str(REAL / "DeviceType.A100_tp1_bs1.json"), str(REAL / "DeviceType.A100_tp1_bs2.json")]
    assert main(["profile", "import", "--from", "metis", *files, "--device", "a100-80g", "-o", str(out),
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["device"] == "a100-80g" and doc["num_rows"] == 6 and len(doc["rows"]) == 6
    assert doc["assumed"] == {"seq_len": 1024, "precision": "fp16"}
    assert doc["rows"][4] == {"kind": "block", "tp": 1, "microbatch": 2, "seq_len": 1024, "precision": "fp16",
                              "forward_ms": 58.86340141296387 / 3, "backward_ms": 58.86340141296387 * 2 / 3,
                              "memory_mb": 4838.5, "model": "GPT3", "origin": "DeviceType.A100_tp1_bs2.json"}
    prof = load_profile(out)
    assert prof.key == "a100-80g" and len(prof.measured.layers) == 6 and len(prof.measured.model_profiles) == 2
    # what the files do not record is the caller's to say
    assert main(["profile", "import", "--from", "metis", str(REAL), "--device", "a100-80g", "-o", str(out),
                 "--model", "gpt3-6.7b", "--seq-len", "2048", "--precision", "bf16"]) == 0
    text = capsys.readouterr().out
    assert "wrote" in text and "note:" not in text  # nothing assumed
    assert main(["profile", "import", "--from", "metis", str(REAL), "--device", "a100-80g", "-o", str(out)]) == 0
    assert ("note: the Metis files record no seq len or precision; assumed seq-len 1024, precision fp16"
            in " ".join(capsys.readouterr().out.split()))
    assert main(["profile", "import", "--from", "metis", str(REAL), "--device", "a100-80g", "-o", str(out),
                 "--model", "gpt3-6.7b", "--seq-len", "2048", "--precision", "bf16"]) == 0
    rows = load_profile(out).measured.layers
    assert {(r.model, r.seq_len, r.precision) for r in rows} == {("gpt3-6.7b", 2048, "bf16")}
    # --device may be a profile file (a measured one): the rows go onto it, its own figures kept
    mine, again = tmp_path / "my-a100.yaml", tmp_path / "again.yaml"
    mine.write_text("schema: hetauto.profile/1\nkey: my-a100\nbase: a100-80g\nmemory_bytes: 40GiB\n")
    assert main(["profile", "import", "--from", "metis", str(REAL), "--device", str(mine), "-o", str(again)]) == 0
    capsys.readouterr()
    got = load_profile(again)
    assert got.key == "my-a100" and got.memory_bytes == 40 * 2**30 and len(got.measured.layers) == 6


def test_import_csv(tmp_path, capsys) -> None:
    src = tmp_path / "layers.csv"
    src.write_text(HEADER + "h100,block,2,4,2048,bf16,12.5,25,4096,gpt3-6.7b\n"
                   "h100,embedding,2,4,2048,bf16,0.5,1.0,,\n"
                   "a100-80g,block,1,1,2048,bf16,30,60,5000,gpt3-6.7b\n")
    out = tmp_path / "h100.json"
    assert main(["profile", "import", "--from", "csv", str(src), "--device", "h100", "--model", "gpt3-6.7b",
                 "-o", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["num_rows"] == 2  # the a100 row is another device's
    assert doc["rows"][0] == {"kind": "block", "tp": 2, "microbatch": 4, "seq_len": 2048, "precision": "bf16",
                              "forward_ms": 12.5, "backward_ms": 25.0, "memory_mb": 4096.0, "model": "gpt3-6.7b",
                              "origin": "layers.csv:2"}
    assert doc["rows"][1]["model"] == "gpt3-6.7b" and "memory_mb" not in doc["rows"][1]  # --model filled it
    assert load_profile(out).measured.layers[0].forward_ms == 12.5
    assert main(["profile", "import", "--from", "csv", str(src), "--device", "mi300x", "--model", "m",
                 "-o", str(out)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"hetauto profile: error: no rows of device 'mi300x' in {src} (its device column holds: a100-80g, h100; "
        "pass --device one of those)")


@pytest.mark.parametrize("body, message", [
    ("h100,block,2,4,2048,bf16,fast,25,4096,m\n",
     "line 2, column fwd_ms: 'fast' is not a number (write a number >= 0 there, e.g. 12.5)"),
    ("h100,block,2,4,2048,bf16,1,2,3,m\nh100,layer,2,4,2048,bf16,1,2,3,m\n",
     "line 3, column kind: 'layer' is not a layer kind (use one of embedding, block, head)"),
    ("h100,block,0,4,2048,bf16,1,2,3,m\n", "line 2, column tp: '0' is below 1 (write an integer >= 1 there)"),
    ("h100,block,2,4,2048,bf16,nan,2,3,m\n", "line 2, column fwd_ms: 'nan' is not a finite number (write a number "
     ">= 0 there (a measurement that failed has no row: leave the line out))"),
    ("h100,block,2,4,2048,bf16,1,inf,3,m\n", "line 2, column bwd_ms: 'inf' is not a finite number (write a number "
     ">= 0 there (a measurement that failed has no row: leave the line out))"),
    ("h100,block,2,4,2048,bf16,1,2,3\n",
     "line 2: has 9 fields but the header has 10 (give one value per column (leave mem_mb empty rather than out))"),
    ("h100,block,2,4,2048,int8,1,2,3,m\n",
     "line 2, column precision: 'int8' is not a precision (use one of bf16, fp16, fp32)"),
    ("h100,block,2,4,2048,bf16,1,2,3,\n",
     "line 2, column model: the row names no model (add a model column, or pass --model NAME for rows that "
     "leave it empty)"),
])
def test_bad_csv_names_file_line_column_and_fix(tmp_path, body: str, message: str) -> None:
    src = tmp_path / "bad.csv"
    src.write_text(HEADER + body)
    with pytest.raises(SpecError) as err:
        read_layer_csv(src)
    assert str(err.value) == f"{src}: {message}"


def test_bad_csv_header(tmp_path, capsys) -> None:
    src = tmp_path / "bad.csv"
    src.write_text("device,kind,tp,microbatch,seq,precision,fwd_ms,bwd_ms,mem_mb\n")
    assert main(["profile", "import", "--from", "csv", str(src), "--device", "h100", "-o",
                 str(tmp_path / "o.yaml")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"hetauto profile: error: {src}: line 1, column seq: unknown column (columns are device, kind, tp, "
        "microbatch, seq_len, precision, fwd_ms, bwd_ms, mem_mb and optionally model, hidden)")
