"""Where the lead's control store listens (issue 41 item 2): the one address the launch names, not every interface.

Why: the lead node's agent used to listen on 0.0.0.0 (or ::), so the store was reachable on every network the lead
machine sits on (a management network, a public address) while the job needs it on one. The store already refuses
any connection without the job's secret; listening on one address keeps the others from reaching it at all.

The address, in order: the master address itself when it is one of this host's (what every node connects to);
else the address of the lead site's `--iface` interface (a master behind NAT: the others reach a public address that
forwards to that interface); else every interface, with a note saying so and how to narrow it. A master given as a
name that resolves to loopback here (Debian's 127.0.1.1 line in /etc/hosts) is not taken at its word: the other
sites resolve that name elsewhere.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path

from hetauto.core.errors import HetautoError

__all__ = ["ListenAddress", "lead_listen_address", "interface_addresses", "is_own_address"]

_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address


@dataclass(frozen=True)
class ListenAddress:
    """The address to bind, and a note for the operator when it is every interface (None otherwise)."""

    bind: str
    note: str | None = None


def lead_listen_address(master_addr: str, iface: str | None, site: str = "") -> ListenAddress:
    """Where the lead's control store listens, for a launch whose master is `master_addr` and whose lead site names
    `iface` (its --iface; None when the launch named none)."""
    resolved = _resolve(master_addr)
    named_loopback = resolved is not None and _is_loopback(resolved) and not _is_loopback(master_addr)
    if resolved is not None and not named_loopback and is_own_address(resolved):
        return ListenAddress(resolved)
    if iface:
        own = interface_addresses(iface)
        if not own:
            raise HetautoError(f"--iface {iface}: this host has no interface {iface!r} with an address, so the "
                               f"control store cannot listen there; launch with the interface the other sites reach "
                               "the lead on (ip -brief address lists them)")
        family_first = sorted(own, key=lambda a: (":" in a) != (":" in (resolved or "")))
        return ListenAddress(family_first[0])
    wildcard = "::" if ":" in (resolved or master_addr) else "0.0.0.0"
    why = ("resolves to loopback on this host" if named_loopback else
           "is not an address of this host (behind NAT?)" if resolved is not None else "does not resolve here")
    where = f"--iface {site}=IFNAME" if site else "--iface IFNAME"
    return ListenAddress(wildcard, f"note: the control store listens on every interface: the master address "
                                   f"{master_addr} {why}; launch with {where} to listen on one")


def _resolve(host: str) -> str | None:
    """The first address `host` resolves to (IPv4 first), or None."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), None, proto=socket.IPPROTO_TCP)
    except OSError:
        return None
    addresses = [str(info[4][0]) for info in infos]
    addresses.sort(key=lambda a: ":" in a)
    return addresses[0] if addresses else None


def is_own_address(address: str) -> bool:
    """Whether this host can listen on `address` (it is one of its own)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as probe:
            probe.bind((address, 0))
        return True
    except OSError:
        return False


def interface_addresses(ifname: str) -> list[str]:
    """The addresses of interface `ifname` (IPv4 first, then global IPv6); empty when it has none or is absent."""
    found: list[str] = []
    v4 = _ipv4_address(ifname)
    if v4 is not None:
        found.append(v4)
    try:
        rows = Path("/proc/net/if_inet6").read_text(encoding="ascii").splitlines()
    except OSError:
        rows = []
    for row in rows:
        fields = row.split()
        if len(fields) == 6 and fields[5] == ifname and fields[3] == "00":  # scope 00: global
            found.append(str(ipaddress.IPv6Address(bytes.fromhex(fields[0]))))
    return found


def _ipv4_address(ifname: str) -> str | None:
    import fcntl
    import struct

    if not ifname or len(ifname.encode()) > 15:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            answer = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", ifname.encode()))
        except OSError:  # no such interface, or it has no IPv4 address
            return None
    return socket.inet_ntoa(answer[20:24])


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"
