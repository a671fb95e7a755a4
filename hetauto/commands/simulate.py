"""`hetauto simulate` (not implemented yet)."""

from __future__ import annotations

import argparse

from hetauto.core.errors import HetautoError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    raise HetautoError("'hetauto simulate' is not implemented yet")
