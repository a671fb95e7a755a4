"""Read every tensor of a checkpoint and name those holding nan or inf.

Why apart from `verify_checkpoint`: that check is torch-free (sizes, hashes, metadata) and proves the bytes are
the ones written, not that the numbers are usable; a diverged run's checkpoint is intact byte for byte and
useless. This reads each stored chunk with `torch.load(weights_only=True)` (never a pickle), one at a time.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

__all__ = ["nonfinite_tensors"]


def nonfinite_tensors(directory: str | os.PathLike) -> list[str]:
    """'<tensor>: N of M values are nan/inf' for each stored tensor chunk that is not all finite (empty: all
    finite). `directory` is one checkpoint (`step-…`) whose metadata already verified."""
    import torch

    from hetauto.core.checkpoint_manifest import METADATA_FILE

    path = Path(directory)
    meta = json.loads((path / METADATA_FILE).read_text(encoding="utf-8"))
    entries = sorted(meta.get("storage", []), key=lambda s: (s["path"], s["start"]))
    counts: dict[str, list[int]] = {}  # tensor name -> [non-finite, total, nan]
    handles: dict[str, io.BufferedReader] = {}
    try:
        for s in entries:
            f = handles.get(s["path"])
            if f is None:
                f = handles[s["path"]] = open(path / s["path"], "rb")
            f.seek(s["start"])
            t = torch.load(io.BytesIO(f.read(s["length"])), map_location="cpu", weights_only=True)
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                continue
            bad = ~torch.isfinite(t)
            c = counts.setdefault(str(s["fqn"]), [0, 0, 0])
            c[0] += int(bad.sum())
            c[1] += t.numel()
            c[2] += int(torch.isnan(t).sum())
    finally:
        for f in handles.values():
            f.close()
    out = []
    for name, (bad, total, nan) in sorted(counts.items()):
        if bad:
            kind = "nan" if nan == bad else "inf" if nan == 0 else "nan/inf"
            out.append(f"{name}: {bad} of {total} values are {kind}")
    return out
