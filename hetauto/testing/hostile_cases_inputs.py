"""Hostile cases of issue 42 ("inputs that cannot hurt"): names that would become code or paths, numbers out of
any hardware's range, duplicate keys, booleans for counts, launch options that cannot work, closed pipes and a
second lead agent. hetauto.testing.hostile_cases.all_cases() includes them; each is one line, as there.

Why a table of its own: these are the kinds a user is *handed* (a cluster file, a plan, a launch plan) or types
in a hurry, and a reviewer should see every rule of hetauto.core.names, hetauto.core.netaddr,
hetauto.launch.inputs and hetauto.core.units exercised in one place.
"""

from __future__ import annotations

import json
from typing import Any

from hetauto.testing.hostile import Case
from hetauto.testing.hostile_cases import (PLAN, QUICK_SEARCH, _cli, _edit_json, _launch_dir, cluster, plan_set,
                                           stage0, yaml_doc)

MARKER = "MARKER"
INJECT = f"x\ntouch {MARKER} #"
BAD_NAMES = {  # label -> a cluster/site name every target must refuse
    "newline and a command": INJECT, "parent folder": "../x", "absolute path": "/tmp/x", "slash": "a/b",
    "a space": "a b", "only a space": " ", "trailing space": "siteB ", "zero-width space": "site\u200bB",
    "empty": "", "leading dot": ".hidden", "leading dash": "-x", "semicolon": "a;b", "command substitution": "$(id)",
    "backticks": "`id`", "single quote": "a'b", "double quote": 'a"b', "64 characters": "x" * 64,
    "non-ASCII letter": "fäst", "snowman": "☃", "tab": "a\tb", "colon": "a:b", "star": "a*", "tilde": "~x",
    "backslash": "a\\b", "NUL": "a\x00b", "hash": "#x", "pipe": "a|b", "ampersand": "a&b", "redirect": "a>b",
    "braces": "{a}", "brackets": "[a]", "comma": "a,b", "equals": "a=b", "carriage return": "a\rb",
    "line separator": "a\u2028b", "dollar": "$HOME",
}
GOOD_NAMES = ("a", "A1", "h100-site.a", "x_y", "x" * 63, "1a", "a.b-c_d")


def _with_name(name: Any, index: int = 0) -> str:
    return cluster(lambda d: d["clusters"][index].update(name=name))


def name_cases() -> list[Case]:
    m = ("--model", "tiny-gpt", *QUICK_SEARCH)
    out = [_cli("plan", f"cluster name: {label}", "--cluster", "bad.yaml", *m, files={"bad.yaml": _with_name(v)},
                mention=("bad.yaml", "name"), forbid=(MARKER,)) for label, v in BAD_NAMES.items()]
    out += [_cli("plan", f"cluster name {v[:12]!r} is valid", "--cluster", "ok.yaml", *m,
                 files={"ok.yaml": cluster(lambda d, v=v: (d["clusters"][0].update(name=v),
                                                           d["clusters"][1].update(name="other")))}, accept=True)
            for v in GOOD_NAMES]
    out += [
        _cli("plan", "cluster name null", "--cluster", "bad.yaml", *m, files={"bad.yaml": _with_name(None)},
             mention=("bad.yaml", "name")),
        _cli("plan", "cluster name a number", "--cluster", "bad.yaml", *m, files={"bad.yaml": _with_name(7)},
             mention=("bad.yaml", "name")),
        _cli("plan", "cluster names differ only in case", "--cluster", "bad.yaml", *m,
             files={"bad.yaml": _with_name("FAST", 1)}, mention=("bad.yaml", "case")),
        _cli("plan", "links.overrides.between names a path", "--cluster", "bad.yaml", *m, files={"bad.yaml": cluster(
            lambda d: d["links"].update(overrides=[{"between": ["fast", "../x"], "bandwidth": "1Gbps"}]))},
             mention=("bad.yaml", "between")),
        _cli("plan", "links.overrides.between carries a newline", "--cluster", "bad.yaml", *m, files={
            "bad.yaml": cluster(lambda d: d["links"].update(
                overrides=[{"between": ["fast", INJECT], "bandwidth": "1Gbps"}]))}, mention=("bad.yaml", "between")),
    ]
    return out


def _launch(name: str, plan_text: str, *mention: str, target: str = "torchrun") -> Case:
    return _cli("launch", name, "bad.json", "--master", "10.0.0.1", "--target", target, "-o", "o/sub",
                files={"bad.json": plan_text}, mention=("bad.json", *mention), forbid=(MARKER, "o/x", "x"))


def plan_name_cases() -> list[Case]:
    return [
        _launch("plan stage cluster '../x' (torchrun)", stage0(cluster="../x"), "cluster"),
        _launch("plan stage cluster '../x' (kubernetes)", stage0(cluster="../x"), "cluster", target="kubernetes"),
        _launch("plan stage cluster '../x' (skypilot)", stage0(cluster="../x"), "cluster", target="skypilot"),
        _launch("plan stage cluster with a newline and a command", stage0(cluster=INJECT), "cluster"),
        _launch("plan stage cluster with a space", stage0(cluster="fa st"), "cluster"),
    ]


def site_cases() -> list[Case]:
    def la(name: str, *argv: str, **kw: Any) -> Case:
        return _cli("launch", name, "plan.json", "--master", "10.0.0.1", "-o", "o/sub", *argv, **kw)

    return [
        la("--site name '../x'", "--site", "../x=fast,slow", mention=("--site",), forbid=("o/x", "x")),
        la("--site name with a newline", "--site", "a\ntouch MARKER=fast,slow", mention=("--site",),
           forbid=(MARKER,)),
        la("--site name with a space", "--site", "a b=fast,slow", mention=("--site",)),
        la("--site name with a slash (kubernetes)", "--target", "kubernetes", "--site", "a/b=fast,slow",
           mention=("--site",)),
        la("--site names differ only in case", "--site", "A=fast", "--site", "a=slow", mention=("--site", "case")),
        la("--site name given twice", "--site", "a=fast", "--site", "a=slow", mention=("--site", "twice")),
        la("--site name valid", "--site", "site.a=fast,slow", accept=True),
    ]


def _edited_launch(name: str, edit: Any, rank: str = "1") -> Case:
    return _cli("node", name, "L/launch.json", "--node-rank", rank,
                setup=lambda f: (_launch_dir(f), _edit_json(f / "L/launch.json", edit)), mention=("launch.json",),
                forbid=(MARKER,))


def launch_file_cases() -> list[Case]:
    return [
        _edited_launch("launch.json site name '../x'", lambda d: d["sites"][1].update(name="../x")),
        _edited_launch("launch.json site name with a command", lambda d: d["sites"][1].update(name=INJECT)),
        _edited_launch("launch.json lead_site with a newline", lambda d: d["rendezvous"].update(lead_site=INJECT)),
        _edited_launch("launch.json master_addr with a command",
                       lambda d: d["rendezvous"].update(master_addr="h\ntouch MARKER")),
        _edited_launch("launch.json master_addr 0.0.0.0", lambda d: d["rendezvous"].update(master_addr="0.0.0.0")),
        _edited_launch("launch.json node cluster '../x'", lambda d: d["sites"][1]["nodes"][0].update(cluster="../x")),
        _cli("node", "launch.json with a duplicate key", "bad.json", "--node-rank", "0", files={
            "bad.json": '{"schema": "hetauto.launch/1",\n "schema": "hetauto.launch/1"}'},
             mention=("bad.json", "duplicate", "schema")),
    ]


def _bw(field: str, value: str, where: str = "default") -> str:
    if where == "default":
        return cluster(lambda d: d["links"]["default"].update({field: value}))
    return cluster(lambda d: d["clusters"][0].update({where: {field: value}}))


def unit_cases() -> list[Case]:
    m = ("--model", "tiny-gpt", *QUICK_SEARCH)

    def bad(name: str, text: str, *mention: str) -> Case:
        return _cli("plan", name, "--cluster", "bad.yaml", *m, files={"bad.yaml": text}, mention=("bad.yaml", *mention))

    def ok(name: str, text: str) -> Case:
        return _cli("plan", name, "--cluster", "ok.yaml", *m, files={"ok.yaml": text}, accept=True)

    return [
        bad("bandwidth 1e300Gbps", _bw("bandwidth", "1e300Gbps"), "bandwidth"),
        bad("bandwidth 1e-300Gbps", _bw("bandwidth", "1e-300Gbps"), "bandwidth"),
        bad("bandwidth 1e20Gbps", _bw("bandwidth", "1e20Gbps"), "bandwidth"),
        bad("bandwidth 0.5bps", _bw("bandwidth", "0.5bps"), "bandwidth"),
        bad("bandwidth 2PB/s", _bw("bandwidth", "2PB/s"), "bandwidth"),
        bad("bandwidth in Gibps", _bw("bandwidth", "10Gibps"), "Gibps"),
        bad("bandwidth in Mibps", _bw("bandwidth", "10Mibps"), "Mibps"),
        bad("bandwidth in Tibps", _bw("bandwidth", "1Tibps"), "Tibps"),
        bad("bandwidth in Gib/s", _bw("bandwidth", "10Gib/s"), "Gib/s"),
        bad("bandwidth in Gibit/s", _bw("bandwidth", "10Gibit/s"), "Gibit/s"),
        bad("shared_capacity 1e300Gbps", _bw("shared_capacity", "1e300Gbps"), "shared_capacity"),
        bad("intra_node bandwidth 1e-300GB/s", _bw("bandwidth", "1e-300GB/s", "intra_node"), "bandwidth"),
        bad("inter_node bandwidth 1e300Gbps", _bw("bandwidth", "1e300Gbps", "inter_node"), "bandwidth"),
        bad("window 2000PB", _bw("window", "2000PB"), "window"),
        bad("measured row of 2000PB", cluster(lambda d: d["links"]["default"].update(
            measured=[{"bytes": "2000PB", "seconds": "1s"}])), "bytes"),
        ok("bandwidth 1kbps (the floor) is valid", _bw("bandwidth", "1kbps")),
        ok("bandwidth 1PB/s (the ceiling) is valid", _bw("bandwidth", "1PB/s")),
        ok("bandwidth 400Gbps is valid", _bw("bandwidth", "400Gbps")),
        ok("bandwidth 10GiB/s is valid", _bw("bandwidth", "10GiB/s")),
    ]


def duplicate_key_cases() -> list[Case]:
    m = ("--model", "tiny-gpt", *QUICK_SEARCH)
    good = yaml_doc({"clusters": [{"name": "a", "nodes": {"count": 1, "devices_per_node": 2, "device": "cpu"}}]})

    def bad(name: str, text: str, *mention: str, suffix: str = "yaml") -> Case:
        f = f"bad.{suffix}"
        return _cli("plan", name, "--cluster", f, *m, files={f: text}, mention=(f, "duplicate", *mention))

    plan_text = json.dumps(PLAN, indent=1)
    return [
        bad("YAML: clusters twice", good + good, "clusters"),
        bad("YAML: a cluster's name twice", "clusters:\n- name: a\n  name: b\n  nodes: {count: 1, devices_per_node: 2, "
            "device: cpu}\n", "name"),
        bad("YAML: nodes.count twice", "clusters:\n- name: a\n  nodes:\n    count: 1\n    devices_per_node: 2\n"
            "    device: cpu\n    count: 8\n", "count"),
        bad("YAML: link bandwidth twice", "links:\n  default: {bandwidth: 1Gbps, bandwidth: 100Gbps}\n" + good,
            "bandwidth"),
        bad("JSON: a cluster's name twice", '{"clusters": [{"name": "a",\n "name": "b", "nodes": {"count": 1, '
            '"devices_per_node": 2, "device": "cpu"}}]}', "name", suffix="json"),
        _cli("plan", "YAML: merged keys may be overridden", "--cluster", "ok.yaml", *m, files={"ok.yaml": (
            "clusters:\n  - name: a\n    nodes:\n      <<: {count: 4, devices_per_node: 2, device: cpu}\n"
            "      count: 1\n")}, accept=True),
        _cli("evaluate", "plan JSON: seq_len twice", "bad.json",
             files={"bad.json": plan_text.replace('"seq_len": 32,', '"seq_len": 32,\n "seq_len": 64,')},
             mention=("bad.json", "duplicate", "seq_len")),
        _cli("evaluate", "plan JSON: a stage's tp twice", "bad.json",
             files={"bad.json": plan_text.replace('"tp": 1,', '"tp": 1, "tp": 2,', 1)},
             mention=("bad.json", "duplicate", "tp")),
        _cli("plan", "model config.json: hidden_size twice", "--cluster", "cluster.yaml", "--model", "cfg.json",
             "--iterations", "2", files={"cfg.json": '{"model_type": "gpt2", "n_embd": 64,\n "n_embd": 128, '
                                         '"n_layer": 2, "n_head": 4, "vocab_size": 256, "n_positions": 64}'},
             mention=("cfg.json", "duplicate", "n_embd")),
    ]


def count_cases() -> list[Case]:
    pred = {"iteration_time_s": 1.0, "throughput_samples_s": 1.0, "tokens_s": 1.0, "bubble_fraction": 0.1,
            "peak_memory_bytes": [1.0, 1.0, 1.0]}

    def ev(name: str, text: str, *mention: str) -> Case:
        return _cli("evaluate", name, "bad.json", files={"bad.json": text}, mention=("bad.json", *mention))

    def run(name: str, text: str, *mention: str) -> Case:
        return _cli("launch", name, "bad.json", "--master", "10.0.0.1", "-o", "out", files={"bad.json": text},
                    mention=("bad.json", *mention))

    return [
        ev("seq_len true", plan_set(seq_len=True), "seq_len"),
        ev("global_batch true", plan_set(global_batch=True), "global_batch"),
        ev("microbatch_size false", plan_set(microbatch_size=False), "microbatch_size"),
        ev("num_microbatches true", plan_set(num_microbatches=True), "num_microbatches"),
        ev("stage tp true", stage0(tp=True), "tp"),
        ev("stage dp true", stage0(dp=True), "dp"),
        ev("stage devices [true]", stage0(devices=[True]), "devices"),
        ev("stage layers [0, true]", stage0(layers=[0, True]), "layers"),
        run("prediction.iteration_time_s -1", plan_set(prediction={**pred, "iteration_time_s": -1}),
            "iteration_time_s"),
        run("prediction.iteration_time_s 0", plan_set(prediction={**pred, "iteration_time_s": 0}),
            "iteration_time_s"),
        run("prediction.throughput_samples_s -5", plan_set(prediction={**pred, "throughput_samples_s": -5}),
            "throughput_samples_s"),
        run("prediction.tokens_s -1", plan_set(prediction={**pred, "tokens_s": -1}), "tokens_s"),
        run("prediction.peak_memory_bytes [-1]", plan_set(prediction={**pred, "peak_memory_bytes": [-1.0]}),
            "peak_memory_bytes"),
    ]


def master_cases() -> list[Case]:
    def la(name: str, master: str, **kw: Any) -> Case:
        return _cli("launch", name, "plan.json", "--master", master, "-o", "out", **kw)

    bad = {"a URL": "http://h:29500", "an https URL": "https://h", "two ports": "h:29500:29501",
           "an octet over 255": "999.1.1.1", "256.0.0.1": "256.0.0.1", "three octets": "1.2.3",
           "the IPv4 wildcard": "0.0.0.0", "the IPv6 wildcard": "[::]:29500", "a bare IPv6 with a port":
           "fd00::1:29500", "brackets around a name": "[node0]:29500", "text after the bracket": "[::1]x",
           "an empty port": "h:", "port 65535 (no room for the control port)": "h:65535",
           "a leading dash": "-h", "an underscore-only label with a dot run": "a..b"}
    out = [la(f"--master {label}", v, mention=("--master",)) for label, v in bad.items()]
    out += [la(f"--master {v} is valid", v, accept=True)
            for v in ("[fd00::1]:29500", "[::1]", "fd00::1", "node-0.example.com:29500", "10.0.0.1:1")]
    out += [_cli("run", "--print-launch --master a URL", "plan.json", "--print-launch", "--master", "http://h:1",
                 mention=("--master",)),
            _cli("run", "--print-launch --master two ports", "plan.json", "--print-launch", "--master", "h:1:2",
                 mention=("--master",)),
            _cli("run", "--print-launch --master [::1]:29500 is valid", "plan.json", "--print-launch", "--master",
                 "[::1]:29500", accept=True)]
    return out


def launch_option_cases() -> list[Case]:
    def la(name: str, *argv: str, **kw: Any) -> Case:
        return _cli("launch", name, "plan.json", "--master", "10.0.0.1", "-o", "out", *argv, **kw)

    managed = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES",
               "ZE_AFFINITY_MASK", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
               "LOCAL_WORLD_SIZE", "NODE_RANK", "PYTHONPATH", "PYTHONHOME", "LD_PRELOAD", "HETAUTO_BACKEND",
               "HETAUTO_PLUGINS", "HETAUTO_MODEL_CODE", "HETAUTO_CONTROL", "OMP_NUM_THREADS")
    out = [la(f"--env {v}", "--env", f"{v}=1", mention=("--env", v)) for v in managed]
    out += [
        la("--env RANK for one site", "--env", "fast:RANK=0", mention=("--env", "RANK")),
        la("--env the same key twice", "--env", "A=1", "--env", "A=2", mention=("--env", "twice")),
        la("--env the same key twice, same value", "--env", "A=1", "--env", "A=1", mention=("--env", "twice")),
        la("--env the same key twice for one site", "--env", "fast:A=1", "--env", "fast:A=2",
           mention=("--env", "twice")),
        la("--env GLOO_SOCKET_IFNAME against --iface", "--env", "GLOO_SOCKET_IFNAME=eth1", "--iface", "eth0",
           mention=("--env", "--iface")),
        la("--env NCCL_DEBUG is the user's", "--env", "NCCL_DEBUG=INFO", accept=True),
        la("--env a key for all and one site", "--env", "A=1", "--env", "fast:A=2", accept=True),
        la("--iface twice", "--iface", "eth0", "--iface", "eth1", mention=("--iface",)),
        la("--iface twice for one site", "--iface", "fast=eth0", "--iface", "fast=ib0", mention=("--iface", "fast")),
        la("--iface common and per site", "--iface", "fast=ib0", "--iface", "eth0", accept=True),
        la("--site-option the same key twice", "--target", "slurm", "--site-option", "fast.partition=a",
           "--site-option", "fast.partition=b", mention=("--site-option", "twice")),
        la("slurm mem=lots", "--target", "slurm", "--site-option", "fast.mem=lots", mention=("mem",)),
        la("slurm mem=1.5G", "--target", "slurm", "--site-option", "fast.mem=1.5G", mention=("mem",)),
        la("slurm mem=64G is valid", "--target", "slurm", "--site-option", "fast.mem=64G", accept=True),
        la("slurm mem=0 is valid", "--target", "slurm", "--site-option", "fast.mem=0", accept=True),
        la("site option with $()", "--target", "slurm", "--site-option", "fast.account=$(id)",
           mention=("--site-option", "$")),
        la("site option with backticks", "--target", "slurm", "--site-option", "fast.qos=`id`",
           mention=("--site-option", "`")),
        la("site option with a semicolon", "--target", "slurm", "--site-option", "fast.partition=a;b",
           mention=("--site-option", ";")),
        la("site option with a space", "--target", "slurm", "--site-option", "fast.partition=a b",
           mention=("--site-option",)),
        la("site option with a quote", "--target", "slurm", "--site-option", "fast.partition=a'b",
           mention=("--site-option",)),
        la("kubernetes image with a newline", "--target", "kubernetes", "--site-option", "fast.image=img\nkind: x",
           "--site-option", "slow.image=img", mention=("--site-option",)),
        la("skypilot region with $()", "--target", "skypilot", "--site-option", "fast.region=$(id)",
           mention=("--site-option",)),
    ]
    return out


def profile_link_cases() -> list[Case]:
    def pl(name: str, *argv: str, **kw: Any) -> Case:
        return _cli("profile", name, "profile", "link", *argv, **kw)

    return [
        pl("link --master a URL", "--master", "http://h:29600", mention=("--master",)),
        pl("link --master two ports", "--master", "h:29600:29601", mention=("--master",)),
        pl("link --master port 0 of an IPv6", "--master", "[::1]:0", mention=("--master",)),
        pl("link --master an octet over 255", "--master", "999.1.1.1:29600", mention=("--master",)),
        pl("link --master the wildcard", "--master", "0.0.0.0:29600", mention=("--master",)),
        pl("link --master a bare IPv6 with a port", "--master", "fd00::1:29600", mention=("--master",)),
        pl("link --master an IPv6 without a port", "--master", "[fd00::1]", mention=("--master",)),
        pl("link --sizes 1PiB", "--local", "--sizes", "1PiB", mention=("--sizes",)),
        pl("link --sizes 5GiB", "--local", "--sizes", "5GiB", mention=("--sizes",)),
        pl("link --flows 100000", "--local", "--flows", "100000", mention=("--flows",)),
        pl("link --flows 257", "--local", "--flows", "257", mention=("--flows",)),
        pl("link 4GiB x 8 flows", "--local", "--sizes", "4GiB", "--flows", "8", mention=("--sizes",)),
    ]


def closed_pipe_cases() -> list[Case]:
    def cp(command: str, *argv: str, **kw: Any) -> Case:
        label = " ".join(a for a in (command, *argv) if a)
        return _cli(command, f"into a closed pipe: {label}", *argv, closed_stdout=True, **kw)

    return [
        cp("scenarios"), cp("scenarios", "--json"), cp("models"), cp("models", "--json"), cp("devices"),
        cp("devices", "--json"), cp("backends"), cp("backends", "--json"), cp("hetauto", "--help"),
        cp("plan", "--help"), cp("launch", "--help"),
        cp("plan", "--scenario", "cpu-demo", *QUICK_SEARCH),
        cp("plan", "--scenario", "cpu-demo", *QUICK_SEARCH, "--json"),
        cp("evaluate", "plan.json"), cp("evaluate", "plan.json", "--json"),
        cp("simulate", "plan.json"), cp("simulate", "plan.json", "--json"),
        cp("launch", "plan.json", "--master", "10.0.0.1", "-o", "out"),
        cp("launch", "plan.json", "--master", "10.0.0.1", "-o", "out", "--json"),
        cp("launch", "plan.json", "--master", "http://h", "-o", "out", "--json"),
        cp("checkpoint", "verify", "ckpt", "--json"),
        cp("run", "plan.json", "--print-launch", "--master", "10.0.0.1"),
    ]


def _held_port_lead() -> None:
    """A second lead agent on this machine: the control port is held by a listener (the first one)."""
    import socket
    import tempfile

    from hetauto.launch.control import ControlServer

    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        ControlServer(tempfile.mkdtemp(dir="."), bind="0.0.0.0", port=held.getsockname()[1])


def _unreachable_bind() -> None:
    import tempfile

    from hetauto.launch.control import ControlServer

    ControlServer(tempfile.mkdtemp(dir="."), bind="203.0.113.7", port=0)  # TEST-NET-3: not this machine's


def node_agent_cases() -> list[Case]:
    return [
        Case(command="node", name="a second node rank 0 on one machine: its control port is held",
             call=_held_port_lead, mention=("port", "in use", "node rank 0")),
        Case(command="node", name="a lead bound to an address that is not this machine's", call=_unreachable_bind,
             mention=("cannot listen", "203.0.113.7")),
    ]


def issue42_cases() -> list[Case]:
    return (name_cases() + plan_name_cases() + site_cases() + launch_file_cases() + unit_cases()
            + duplicate_key_cases() + count_cases() + master_cases() + launch_option_cases() + profile_link_cases()
            + closed_pipe_cases() + node_agent_cases())
