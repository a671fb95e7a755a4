"""`hetauto checkpoint verify D [--json] [--no-hashes]`: is a checkpoint intact?
`hetauto checkpoint export D --format hf -o OUT [--json]`: the checkpoint, of any plan layout, as one Hugging
Face checkpoint folder (config.json + model.safetensors) that transformers and `hetauto run --init-from` read.

`D` is a checkpoint directory (`step-…`) or a `--checkpoint-dir` root (its newest complete checkpoint). The
same check `hetauto run --resume D` makes before it launches anything: every file the manifest lists exists
with its size and sha256, each shard's hash record (written by the rank that wrote the shard) agrees, the
DCP metadata parses and points only inside listed files, every rank file is JSON; then (unless `--no-hashes`)
every stored tensor is read (`torch.load(weights_only=True)`) and one holding nan or inf is named. Exit 0 when
intact and finite; else exit 5 with one line naming the first bad file or tensor and the previous complete
checkpoint that verifies.
"""

from __future__ import annotations

import argparse
from typing import Any

from hetauto.core.errors import CheckpointError, HetautoError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    v = sub.add_parser("verify", help="check a checkpoint's files against its manifest (sizes, sha256, metadata)")
    v.add_argument("directory", help="a checkpoint directory (step-...) or a --checkpoint-dir root (its newest)")
    v.add_argument("--no-hashes", action="store_true", help="sizes and metadata only (fast; no sha256, no nan/inf scan)")
    v.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print one JSON document on stdout")
    e = sub.add_parser("export", help="write the checkpoint as a Hugging Face checkpoint folder")
    e.add_argument("directory", help="a checkpoint directory (step-...) or a --checkpoint-dir root (its newest)")
    e.add_argument("--format", choices=("hf",), default="hf", help="hf: config.json + model.safetensors (llama; gpt as gpt2)")
    e.add_argument("-o", "--output", required=True, metavar="OUT", help="the folder to write")
    e.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print one JSON document on stdout")


def verify_document(directory: str, *, hashes: bool = True) -> dict[str, Any]:
    """What `hetauto checkpoint verify --json` prints: checkpoint, step, files, bytes, ok, problems, previous_ok."""
    from hetauto.core.checkpoint_manifest import resolve_checkpoint, previous_verified, read_manifest, verify_checkpoint

    path = resolve_checkpoint(directory)
    try:
        man = read_manifest(path)
        problems = verify_checkpoint(path, hashes=hashes)
        step, files, size = man.step, len(man.files), sum(int(f.get("bytes", 0)) for f in man.files.values())
    except CheckpointError as exc:
        problems, step, files, size = [str(exc)], None, 0, 0
    nonfinite: list[str] = []
    if hashes and not problems:  # the bytes are the ones written: are the numbers usable? (reads every tensor)
        from hetauto.runtime.checkpoint_scan import nonfinite_tensors

        nonfinite = nonfinite_tensors(path)
    prev = previous_verified(path, hashes=hashes) if problems or nonfinite else None
    return {"checkpoint": str(path), "step": step, "files": files, "bytes": size, "hashes": hashes,
            "ok": not problems and not nonfinite, "problems": problems, "nonfinite": nonfinite,
            "previous_ok": None if prev is None else str(prev)}


def run(args: argparse.Namespace) -> int:
    from hetauto.commands._output import print_json

    if args.action == "export":
        from hetauto.core.checkpoint_manifest import require_intact
        from hetauto.runtime.hf_weights import export_hf

        require_intact(args.directory)  # nothing damaged is exported
        doc = export_hf(args.directory, args.output)
        if getattr(args, "json", False):
            print_json(doc)
        else:
            print(f"exported step {doc['step']} of {doc['checkpoint']} to {doc['output']} ({doc['tensors']} tensors, "
                  f"{doc['parameters']:,} parameters; config.json + model.safetensors)")
        return 0
    if args.action != "verify":
        raise HetautoError("say what to do: hetauto checkpoint verify DIR [--json], or export DIR --format hf -o OUT")

    doc = verify_document(args.directory, hashes=not args.no_hashes)
    if args.json:
        print_json(doc)
        return 0 if doc["ok"] else CheckpointError.exit_code
    if doc["problems"]:
        from hetauto.core.checkpoint_manifest import require_intact

        require_intact(doc["checkpoint"], hashes=doc["hashes"])  # raises the one-line error the CLI prints
    if doc["nonfinite"]:
        more = f" (and {len(doc['nonfinite']) - 1} more tensor(s))" if len(doc["nonfinite"]) > 1 else ""
        prev = doc["previous_ok"]
        offer = (f"; the previous complete checkpoint {prev} verifies: resume with --resume {prev}" if prev
                 else "; no earlier complete checkpoint verifies")
        raise CheckpointError(f"checkpoint {doc['checkpoint']} is intact but holds non-finite values: "
                              f"{doc['nonfinite'][0]}{more}{offer}")
    from hetauto.core.units import format_bytes

    print(f"{doc['checkpoint']}: intact (step {doc['step']}, {doc['files']} files, {format_bytes(doc['bytes'])}"
          + (", sha256 checked)" if doc["hashes"] else ", sizes and metadata only)"))
    return 0
