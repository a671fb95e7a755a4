"""`hetauto data prepare TEXT... [--tokenizer bytes|DIR] -o OUT.bin [--json]`: tokenize local text files
into a token file that `hetauto run --data OUT.bin` trains on (hetauto.runtime.token_data).

Tokenizers: `bytes` (the default) maps each byte to its value, a 256-id vocabulary (the catalog's tiny
models); a folder holding a Hugging Face `tokenizer.json` is read with the `tokenizers` package from local
disk only (no hub access). Each file is one document; a progress bar counts the files.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable

from hetauto.commands._output import print_json
from hetauto.core.errors import HetautoError

BYTES = "bytes"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    prep = sub.add_parser("prepare", help="tokenize local text files into a token file")
    prep.add_argument("texts", nargs="+", metavar="TEXT", help="text files (UTF-8 or any bytes), one document each")
    prep.add_argument("--tokenizer", default=BYTES,
                      help="'bytes' (256 ids, default) or a folder with a Hugging Face tokenizer.json")
    prep.add_argument("-o", "--output", required=True, metavar="OUT.bin", help="the token file to write")
    prep.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def _encoder(spec: str) -> tuple[Callable[[bytes], list[int]], int]:
    """(bytes -> token ids, vocabulary size) for a tokenizer spec."""
    if spec == BYTES:
        return (lambda raw: list(raw)), 256
    folder = Path(spec)
    file = folder / "tokenizer.json" if folder.is_dir() else folder
    if not file.is_file():
        raise HetautoError(f"--tokenizer {spec}: no tokenizer.json there; give a folder holding a Hugging Face "
                           "tokenizer.json, or 'bytes'")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise HetautoError("--tokenizer DIR needs the tokenizers package: pip install tokenizers") from None
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as err:  # noqa: BLE001 - the tokenizers package raises a bare Exception for a bad file
        raise HetautoError(f"--tokenizer {spec}: {file} is not a tokenizer.json the tokenizers package reads "
                           f"({err}); give a Hugging Face tokenizer folder, or 'bytes'") from None
    return (lambda raw: tok.encode(raw.decode("utf-8", errors="replace")).ids), int(tok.get_vocab_size())


def _ours(path: Path) -> bool:
    """Whether `path` is a token file this command wrote (its sidecar says so): it may be written again."""
    import json

    from hetauto.runtime.token_data import TOKENS_FORMAT

    try:
        meta = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == TOKENS_FORMAT


def _check_output(out: Path, texts: list[Path]) -> None:
    """Nothing the user handed us, or any file not written by this command, is overwritten."""
    sidecar = out.with_suffix(".json")
    if out.is_dir():
        raise HetautoError(f"-o {out}: is a folder; give a file name such as {out / 'tokens.bin'}")
    if not out.parent.is_dir():
        raise HetautoError(f"-o {out}: the folder {out.parent} does not exist")
    inputs = {t.resolve() for t in texts if t.exists()}
    for target, what in ((out, "the token file"), (sidecar, "its sidecar")):
        if target.resolve() in inputs:
            raise HetautoError(f"-o {out}: {what} would overwrite the input {target}; choose another -o, such as "
                               f"{out.with_name(out.stem + '-tokens.bin')}")
    if out.suffix == ".json":
        raise HetautoError(f"-o {out}: the token file and its .json sidecar would be one file; give a .bin name")
    for target in (out, sidecar):
        if target.exists() and not _ours(out):
            raise HetautoError(f"-o {out}: {target} exists and is not a token file written by hetauto data prepare; "
                               "remove it or choose another -o (nothing is overwritten)")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "action", None) != "prepare":
        raise HetautoError("usage: hetauto data prepare TEXT... [--tokenizer bytes|DIR] -o OUT.bin")
    from rich.progress import Progress

    from hetauto.runtime.token_data import write_tokens

    encode, vocab = _encoder(args.tokenizer)
    out = Path(args.output)
    _check_output(out, [Path(t) for t in args.texts])
    docs: list[Any] = []
    with Progress(transient=True, disable=bool(args.json)) as bar:
        task = bar.add_task("tokenizing", total=len(args.texts))
        for name in args.texts:
            if _ours(Path(name)):
                raise HetautoError(f"{name}: is a token file hetauto data prepare wrote, not text; give the text "
                                   f"files (hetauto run --data {name} trains on it as it is)")
            try:
                raw = Path(name).read_bytes()
            except OSError as err:
                raise HetautoError(f"{name}: cannot read it: {err.strerror or err}") from None
            docs.append(encode(raw))
            bar.advance(task)
    total = sum(len(d) for d in docs)
    if not total:
        raise HetautoError(f"{', '.join(args.texts)}: no text (0 tokens); give files with text to train on")
    path = write_tokens(out, docs, vocab)
    doc = {"output": str(path), "sidecar": str(path.with_suffix(".json")), "documents": len(docs), "tokens": total,
           "vocab_size": vocab, "tokenizer": args.tokenizer}
    if args.json:
        print_json(doc)
    else:
        print(f"wrote {total} tokens from {len(docs)} document(s) to {path} (vocabulary {vocab}; sidecar "
              f"{path.with_suffix('.json').name})")
    return 0
