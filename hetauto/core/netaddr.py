"""One parser for `HOST[:PORT]` addresses typed on the command line (`hetauto launch --master`, `hetauto run
--master`, `hetauto profile link --master`).

Why one: `launch` and `profile link` used to read `[::1]:29600` in opposite ways (one took the brackets, the other
timed out connecting to a host named `[::1]`), and each accepted what could never work: a URL, two ports, an
IPv4 address with an octet over 255, the unspecified address 0.0.0.0 that no other machine can dial. The rules:

- an IPv6 address with a port goes in brackets, `[fd00::1]:29500`; a bare IPv6 address (`fd00::1`) is a host on
  the default port, and anything else with two or more colons (`h:29500:29501`, `fd00::1:29500`) is refused as
  ambiguous rather than guessed;
- a dotted-number host must be an IPv4 address; a name must be a DNS host name (letters, digits, `-`, `_`, dots);
- 0.0.0.0 and `::` are refused (a listener's wildcard, not an address a peer can reach);
- a port is a decimal number in 1..65535.
"""

from __future__ import annotations

import ipaddress
import re

__all__ = ["parse_host_port", "format_host_port"]

_HOST_NAME = re.compile(r"(?=.{1,253}\.?$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,62}))*\.?")
_DOTTED = re.compile(r"[0-9.]+")


def parse_host_port(text: str, default_port: int | None = None,
                    example: str = "10.0.0.1:29500") -> tuple[str, int | None]:
    """`HOST[:PORT]` -> (host, port); `default_port` when no port is given. ValueError says what is wrong and what
    to write (the caller names its flag)."""
    value = text.strip()
    if "://" in value:
        raise ValueError(f"{text!r} is a URL; give HOST[:PORT] without a scheme, e.g. {example}")
    if value.startswith("["):
        host, port = _bracketed(value, text)
    elif value.count(":") >= 2:
        host, port = value, None
        if not _is_ipv6(value):
            raise ValueError(f"{text!r} is ambiguous (several ':' but not an IPv6 address); write an IPv6 address "
                             "with its port in brackets, e.g. [fd00::1]:29500, and a host name as HOST:PORT")
    elif ":" in value:
        host, _, p = value.partition(":")
        port = _port(p, example)
        _check_host(host, text, example)
    else:
        host, port = value, None
        _check_host(host, text, example)
    if _is_unspecified(host):
        raise ValueError(f"{host} is the wildcard address, which no other machine can dial; give the lead machine's "
                         f"own address, e.g. {example}")
    return host, default_port if port is None else port


def format_host_port(host: str, port: int) -> str:
    """`host:port`, an IPv6 host in brackets (what parse_host_port reads back)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _bracketed(value: str, text: str) -> tuple[str, int | None]:
    end = value.find("]")
    if end < 0:
        raise ValueError(f"{text!r}: unclosed '['; write an IPv6 address as [ADDR]:PORT, e.g. [fd00::1]:29500")
    host, rest = value[1:end], value[end + 1:]
    if not _is_ipv6(host):
        raise ValueError(f"{text!r}: '{host}' in brackets is not an IPv6 address (e.g. [fd00::1]:29500)")
    if not rest:
        return host, None
    if not rest.startswith(":"):
        raise ValueError(f"{text!r}: expected ':PORT' after ']' (e.g. [fd00::1]:29500)")
    return host, _port(rest[1:], "[fd00::1]:29500")


def _port(text: str, example: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise ValueError(f"port {text!r} is not a number in 1..65535, e.g. {example}")
    return port


def _check_host(host: str, text: str, example: str) -> None:
    if _DOTTED.fullmatch(host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(f"{host!r} is not an IPv4 address (four numbers 0..255), e.g. {example}") from None
        return
    if not _HOST_NAME.fullmatch(host):
        raise ValueError(f"{text!r} is not a host name or address, e.g. {example}")


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def _is_unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False
