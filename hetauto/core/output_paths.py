"""Checks of a command's output paths before any work: writable, not one of its inputs, not each other.

Why in core: the commands and the run service (hetauto.job, which never imports the commands) refuse the same
bad paths with the same one line naming the flag.
"""

from __future__ import annotations

__all__ = ["require_writable", "require_not_input", "require_distinct"]


def require_writable(path: str | None, flag: str) -> None:
    """Before any work: `path` (an output file a command will write) can be written, or one HetautoError line
    naming the flag (so an hour's run does not end in 'internal error' at its last step)."""
    import os
    from pathlib import Path

    from hetauto.core.errors import HetautoError

    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise HetautoError(f"{flag} {path}: is a folder; give a file path")
    folder = p.parent if str(p.parent) else Path(".")
    if not folder.is_dir():
        raise HetautoError(f"{flag} {path}: the folder {folder} does not exist; create it or choose another path")
    if not os.access(folder, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise HetautoError(f"{flag} {path}: not writable here; choose another path")


def require_not_input(path: str | None, flag: str, inputs: dict[str, object]) -> None:
    """Before any work: the output `path` is none of the command's input files ({what: path}), so writing it
    never destroys what the user handed us (e.g. `--trace plan.json`)."""
    from pathlib import Path

    from hetauto.core.errors import HetautoError

    if path is None:
        return
    target = Path(path).resolve()
    for what, given in inputs.items():
        if isinstance(given, (str, Path)) and str(given) and Path(given).is_file() and Path(given).resolve() == target:
            raise HetautoError(f"{flag} {path}: is the {what} this command reads; writing it would destroy it: "
                               "choose another path")


def require_distinct(outputs: dict[str, str | None]) -> None:
    """Two outputs of one command ({flag: path}) are two files: else the second overwrites the first (a plan
    written by -o, then the --plot picture over it)."""
    from pathlib import Path

    from hetauto.core.errors import HetautoError

    seen: dict[Path, str] = {}
    for flag, path in outputs.items():
        if not path:
            continue
        key = Path(path).resolve()
        if key in seen:
            raise HetautoError(f"{seen[key]} and {flag} name the same file {path}; the second would overwrite the "
                               "first: give each its own path")
        seen[key] = flag
