"""The job secret of a launch across sites (issue 41 item 2): what every connection to the lead's control store
proves it holds (hetauto.core.control_store's HMAC challenge), so a stranger who reaches the lead's port can
neither read, abort, fake an error nor block the join.

Why a file and not a field: `hetauto launch` writes `control.secret` (32 random bytes, hex; mode 0600) beside
launch.json and in every site's folder, the one folder each site receives; launch.json, the scripts' text and every
command line carry no secret (a script names the file's path, in `HETAUTO_SECRET_FILE`). An operator may bring
their own file (`--secret-file`: to let two launches join, or a Kubernetes Secret mounted as a file). The node
agent reads, in order: `--secret-file`, `$HETAUTO_SECRET_FILE`, `control.secret` beside the launch plan.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from hetauto.core.errors import HetautoError

__all__ = ["SECRET_FILE", "SECRET_FILE_ENV", "SECRET_DIFFERS", "new_secret", "write_secret", "read_secret",
           "find_secret"]

SECRET_FILE = "control.secret"
SECRET_FILE_ENV = "HETAUTO_SECRET_FILE"  # a path, never the secret itself
SECRET_DIFFERS = ("this node's job secret differs from the lead's: it comes from another launch; use the node scripts "
                  "of one launch, or the same --secret-file")
_MIN_CHARS = 32  # a secret shorter than 16 bytes' hex is a guessable one


def new_secret() -> str:
    """A new job secret: 32 random bytes, hex."""
    return secrets.token_hex(32)


def write_secret(path: Path, secret: str) -> Path:
    """Write `secret` to `path`, readable by its owner only (0600 from its creation on: never a moment wider)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(secret + "\n")
    return path


def read_secret(path: str | Path, flag: str = "--secret-file") -> str:
    """The secret in `path` (surrounding whitespace dropped); a missing, unreadable or short one is one line."""
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise HetautoError(f"{flag} {path}: no such file; give the job's {SECRET_FILE} (hetauto launch wrote it "
                           "beside launch.json and in each site's folder)") from None
    except (OSError, UnicodeDecodeError) as err:
        raise HetautoError(f"{flag} {path}: cannot read it ({getattr(err, 'strerror', None) or err}); give a "
                           "readable file") from None
    if len(text) < _MIN_CHARS or any(c.isspace() for c in text):
        raise HetautoError(f"{flag} {path}: not a job secret (one word of at least {_MIN_CHARS} characters); "
                           "make one with: python3 -c 'import secrets; print(secrets.token_hex(32))' > FILE")
    return text


def find_secret(launch_file: str | Path, given: str | None, environ: dict[str, str] | None = None) -> str:
    """The node agent's secret: `given` (--secret-file), else $HETAUTO_SECRET_FILE, else control.secret beside
    the launch plan; none of them is one line naming the three."""
    env = os.environ if environ is None else environ
    if given:
        return read_secret(given)
    if env.get(SECRET_FILE_ENV):
        return read_secret(env[SECRET_FILE_ENV], SECRET_FILE_ENV)
    beside = Path(launch_file).parent / SECRET_FILE
    if beside.is_file():
        return read_secret(beside, "the launch's")
    raise HetautoError(f"no job secret: {beside} does not exist; give --secret-file PATH (or set {SECRET_FILE_ENV}) "
                       f"naming the {SECRET_FILE} that hetauto launch wrote with this launch plan")
