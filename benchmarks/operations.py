"""Operations figures of issue 41: attacks on a real lead's control port, and what authentication costs a step.

1. Attacks (`attacks`): `hetauto launch` of the two-site plan (1 + 1 ranks, tiny-gpt) on this host, both node
   agents started from the scripts it wrote. Before the member joins, then while the job trains, a catalogue of
   attacker clients (raw sockets speaking the store's wire format; none holds the job's secret unless said) tries:
   reading the nodes' registrations (hosts, pids), setting `abort`, faking a rank's error, faking a registration
   of node rank 1, replaying a captured authenticated exchange, a wrong secret, no secret, a flood of idle
   connections, huge frames, and the seq-counter attack of issue 44 (with no secret, and with the secret: an
   insider or a buggy client). Refused: the attacker got no value, changed no key, and a client with the secret
   was served during the flood. Then: did the job train on (both agents exit 0, every step trained, no stranger's
   text in their output)?
2. Authentication's cost (`auth_cost`): the store authenticates a connection once (an HMAC-SHA256 challenge when it
   connects); after that a message costs the same with or without it. Measured side by side in one process: (a)
   real `hetauto.run` jobs of the 2-rank plan, alternately with the store's token on and off (off: the launcher's
   token switched off in-process; there is no flag for it), the median step time of each; (b) the control plane's
   own cost per step (a step line posted and a heartbeat counted per step) on two stores, one with a token and one
   without, and the connect with its challenge.
3. RSS (`rss`): a 1-rank tiny-gpt `hetauto run` of many steps, the rank's RSS sampled twice a second; growth per
   step is the least-squares slope of RSS over the steps done (`--log-jsonl`), past the first fifth (warm-up).
4. A site lost (`chaos`): the three-site plan (hetauto.testing.three_sites: one rank per site, sites a, b, c on
   127.0.0.1), `--on-site-loss replan`, a checkpoint every step: (a) the run without a fault; (b) site c killed
   (SIGKILL of its agent's process group) once the lead has logged step K: the seconds from the loss (c's agent last
   heard) to the first step on the new plan, the steps of work lost (trained before the loss, after the
   checkpoint), and the goodput (the job's tokens over the wall time from the agents' start to the lead's end)
   against (a)'s; (c) the same loss without the flag, resumed by hand: the job ends, the "operator" plans the same
   job for a and b (hetauto.launch.replan, as `hetauto plan --cluster` would), `hetauto launch --resume` of the
   checkpoint folder and starts both sites at once (no human delay counted: a real operator adds theirs); (d) (b)
   again with c's script run again once epoch 1 has begun: the seconds from its return (the lead saw its agent ask)
   to the first step of the epoch that takes it back, and the steps redone for it (0: taken back at a checkpoint).

    python benchmarks/operations.py [--full] [--json] [--only attacks|auth|rss|chaos]

Fast by default (about 2 minutes on 2 loaded cores); --full: a larger flood, more timed runs, 2000 RSS steps.
The last line is one JSON document with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hetauto.core.control_store import ControlStoreClient, proof  # noqa: E402
from hetauto.launch.node_end import ABORT_KEY  # noqa: E402
from hetauto.runtime.control import MSG_PREFIX, SEQ_KEY, beat_key  # noqa: E402

STRANGER = "FAKE-BY-STRANGER"  # text no agent may ever print
CLAIMS, NODES = "hetauto/claims/", "hetauto/node/"  # hetauto.launch.node_join's keys (hetauto.launch.control)
MARK_ENV = "HETAUTO_BENCH_MARK"


# --- an attacker's client: raw frames, as anyone who reads the wire format would write them
def _frame(obj: Any) -> bytes:
    body = json.dumps(obj).encode()
    return len(body).to_bytes(4, "big") + body


class Raw:
    """One raw TCP connection to the store: reads its challenge, sends frames, reads an answer or the close."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection((host, port), timeout=5)
        self.challenge = self.read()

    def send(self, data: bytes) -> "Raw":
        try:
            self.sock.sendall(data)
        except OSError:
            pass
        return self

    def read(self) -> Any:
        """The next answer, or None when the server closed the connection (or said nothing in 5 s)."""
        try:
            head = self._exact(4)
            return json.loads(self._exact(int.from_bytes(head, "big")))
        except (OSError, ValueError, ConnectionError):
            return None

    def _exact(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed")
            out += chunk
        return out

    def closed(self) -> bool:
        """Whether the server has closed this connection (within 5 s)."""
        try:
            return self.sock.recv(1) == b""
        except OSError:
            return True

    def close(self) -> None:
        self.sock.close()


def _unanswered(port: int, *requests: dict) -> tuple[bool, str]:
    """Send `requests` without proving the secret: refused when no request gets an answer."""
    raw = Raw(port)
    for r in requests:
        raw.send(_frame(r))
    answer = raw.read()
    raw.close()
    return answer is None, "closed before any answer" if answer is None else f"answered {answer}"


Attack = tuple[str, Callable[[], tuple[bool, str]]]  # its name, and the call: (refused, how)


def attack_catalogue(port: int, secret: str, flood: int) -> list[Attack]:
    """The attacks on the control store at `port` (the job's secret for those that use it)."""
    post = lambda counter, prefix, text: {"op": "post", "key": counter, "prefix": prefix, "value": text}

    def named(name: str, fn: Callable[[], tuple[bool, str]]) -> Attack:
        return name, fn

    rank_error = json.dumps({"rank": 0, "kind": "error", "text": f"rank 0: RuntimeError: {STRANGER}"})
    registration = json.dumps({"host": "evil", "pid": 1, STRANGER: True})
    return [
        named("read the nodes' hosts and pids", lambda: _unanswered(
            port, {"op": "get", "key": f"{NODES}0/1"}, {"op": "get", "key": f"{NODES}1/1"})),
        named("set abort", lambda: _unanswered(port, {"op": "set", "key": ABORT_KEY, "value": STRANGER})),
        named("fake a rank's error", lambda: _unanswered(port, post(SEQ_KEY, MSG_PREFIX, rank_error))),
        named("fake a registration of node rank 1", lambda: _unanswered(
            port, post(f"{CLAIMS}1", f"{NODES}1/", registration))),
        named("replay a captured authenticated exchange", lambda: _replay(port, secret)),
        named("wrong secret", lambda: _client_refused(port, "cd" * 32)),
        named("no secret (the client library)", lambda: _client_refused(port, None)),
        named(f"flood of {flood} idle connections", lambda: _flood(port, secret, flood)),
        named("huge frame (2 GiB announced)", lambda: _huge(port, 2 ** 31 - 1)),
        named("frame just over the bound (8 MiB + 1)", lambda: _huge(port, 8 * 1024 * 1024 + 1)),
        named("seq counter to 1e9, no secret", lambda: _unanswered(
            port, {"op": "add", "key": SEQ_KEY, "amount": 10 ** 9})),
        named("seq counter to 1e9, with the secret", lambda: _seq_insider(port, secret)),
    ]


def _replay(port: int, secret: str) -> tuple[bool, str]:
    """A legitimate client's bytes, recorded (its proof and a request), replayed on a new connection."""
    legit = Raw(port)
    nonce = legit.challenge["nonce"]
    captured = _frame({"op": "auth", "role": "node1", "proof": proof(secret, nonce, "node1")}) + \
        _frame({"op": "get", "key": f"{NODES}0/1"})
    legit.send(captured)
    legit_ok = legit.read() == {"ok": True} and legit.read() is not None
    legit.close()
    replayed = Raw(port).send(captured)
    refused = replayed.read() is None
    replayed.close()
    return refused and legit_ok, f"the original was served: {legit_ok}; the replay {'closed' if refused else 'served'}"


def _client_refused(port: int, token: str | None) -> tuple[bool, str]:
    try:
        ControlStoreClient("127.0.0.1", port, timeout_s=5, token=token).set(ABORT_KEY, STRANGER)
    except PermissionError as err:
        return True, str(err).split(": ", 1)[-1]
    return False, "served"


def _flood(port: int, secret: str, count: int) -> tuple[bool, str]:
    """Hold `count` idle connections, then ask as the job would: served within 5 s?"""
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            try:
                held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            except OSError:
                break
        started = time.monotonic()
        try:
            client = ControlStoreClient("127.0.0.1", port, timeout_s=5, token=secret, role="bench")
            client.add("bench/flood", 1)
            client.close()
            served = time.monotonic() - started
        except OSError as err:
            return False, f"a client with the secret was not served during the flood: {err}"
        time.sleep(0.5)
        still = sum(1 for s in held if _open(s))
    finally:
        for s in held:
            s.close()
    return True, (f"{len(held)} opened, {still} still open after 0.5 s (unauthenticated, answered nothing); "
                  f"a client with the secret served in {served:.3f} s")


def _open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        while True:
            chunk = sock.recv(1 << 16)
            if chunk == b"":
                return False
    except BlockingIOError:
        return True
    except OSError:
        return False


def _huge(port: int, size: int) -> tuple[bool, str]:
    raw = Raw(port)
    started = time.monotonic()
    raw.send(size.to_bytes(4, "big") + b"x" * (1 << 20))
    closed = raw.closed()
    raw.close()
    return closed, f"closed after {time.monotonic() - started:.3f} s" if closed else "left open"


def _seq_insider(port: int, secret: str) -> tuple[bool, str]:
    client = ControlStoreClient("127.0.0.1", port, timeout_s=5, token=secret, role="bench")
    before = client.add(SEQ_KEY, 0)
    said = []
    for call in (lambda: client.add(SEQ_KEY, 10 ** 9), lambda: client.set(SEQ_KEY, str(10 ** 9)),
                 lambda: client.post(SEQ_KEY, "elsewhere/", "{}")):
        try:
            call()
            said.append("accepted")
        except RuntimeError as err:
            said.append(str(err).rsplit(": ", 1)[-1])
    after = client.add(SEQ_KEY, 0)
    client.close()
    moved = after - before
    refused = all(s != "accepted" for s in said) and moved < 1000  # the job's own posts move it meanwhile
    return refused, f"add, set and a post elsewhere each refused ({said[0]}); the counter moved {moved} (the job's own)"


# --- the real lead
def _node_env(work: Path, mark: str) -> dict[str, str]:
    from hetauto.testing.two_sites import this_tree_env

    return {**this_tree_env(), "HETAUTO_PYTHON": sys.executable, "HETAUTO_WORKDIR": str(work), MARK_ENV: mark}


def run_attacks(root: Path, steps: int, flood: int) -> dict[str, Any]:
    """The catalogue against a real lead: before the member joins, then while the job trains."""
    from hetauto.cli import main as cli
    from hetauto.testing.multiproc import two_free_ports
    from hetauto.testing.two_sites import write_two_site_plan

    port = two_free_ports()
    (root / "plan").mkdir(parents=True)
    write_two_site_plan(root / "plan", slow_ranks=1)
    out = root / "launch"
    assert cli(["launch", str(root / "plan" / "plan.json"), "--master", f"127.0.0.1:{port}", "-o", str(out),
                "--no-reference", "--join-timeout", "60", "--timeout", "30", "--steps", str(steps)]) == 0
    secret = (out / "control.secret").read_text().strip()
    mark = uuid.uuid4().hex

    def start(r: int, site: str) -> subprocess.Popen:
        return subprocess.Popen(["bash", str(out / site / f"node{r}.sh")], cwd=root, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True,
                                env=_node_env(root / f"node{r}", mark))

    procs = [start(0, "fast")]
    rows: list[dict[str, Any]] = []
    try:
        _wait_port(port + 1, procs[0])
        rss_before = _lead_rss(mark)
        catalogue = attack_catalogue(port + 1, secret, flood)
        rows += [_attempt(a, "before the join") for a in catalogue]
        procs.append(start(1, "slow"))
        steps_file = root / "node0" / "steps.jsonl"
        _wait_for(lambda: steps_file.is_file() and steps_file.read_text().strip() != "", procs, 180)
        rows += [_attempt(a, "while training") for a in catalogue]
        rss_after = _lead_rss(mark)
        errs = [p.communicate(timeout=300)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    trained = len([line for line in steps_file.read_text().splitlines() if line.strip()])
    codes = [p.returncode for p in procs]
    refusal_lines = sum(1 for line in errs[0].splitlines() if "refused a connection to the control store" in line)
    trained_on = codes == [0, 0] and trained == steps and not any(STRANGER in e for e in errs)
    return {"rows": rows, "tried": len(rows), "refused": sum(r["refused"] for r in rows),
            "trained_on": trained_on, "exit_codes": codes, "steps_trained": trained, "steps": steps,
            "lead_refusal_lines": refusal_lines, "lead_rss_mib": [rss_before, rss_after],
            "tail": None if trained_on else [e[-1500:] for e in errs]}


def _attempt(attack: Attack, when: str) -> dict[str, Any]:
    name, call = attack
    try:
        refused, how = call()
    except Exception as err:  # noqa: BLE001 - an attack that errs is a row, not the end of the report
        refused, how = False, f"{type(err).__name__}: {err}"
    return {"attack": name, "when": when, "refused": bool(refused), "how": how}


def _wait_port(port: int, proc: subprocess.Popen, limit: float = 120) -> None:
    def up() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    _wait_for(up, [proc], limit)


def _wait_for(ready: Callable[[], bool], procs: list[subprocess.Popen], limit: float) -> None:
    end = time.monotonic() + limit
    while not ready():
        dead = [p for p in procs if p.poll() is not None]
        if dead or time.monotonic() > end:
            raise RuntimeError("the job ended or stalled before the attacks: "
                               + (dead[0].communicate()[1][-1500:] if dead else "timeout"))
        time.sleep(0.1)


def _lead_rss(mark: str) -> float | None:
    """RSS (MiB) of the lead's agent: the `hetauto ... node` process carrying the mark with node rank 0."""
    for pid in _marked(mark):
        cmd = _read(f"/proc/{pid}/cmdline").split("\0")
        if "node" in cmd and "--node-rank" in cmd and cmd[cmd.index("--node-rank") + 1] == "0":
            return _rss_kib(pid) / 1024
    return None


def _marked(mark: str) -> list[int]:
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit() and f"{MARK_ENV}={mark}" in _read(f"/proc/{d}/environ"):
            found.append(int(d))
    return found


def _read(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _rss_kib(pid: int) -> int:
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# --- authentication's cost
def auth_cost(root: Path, pairs: int, steps: int, messages: int) -> dict[str, Any]:
    """Real jobs with the token on and off, alternately; the control plane's own cost per step on and off."""
    job = _job_steps(root, pairs, steps)
    plane = _plane_cost(messages)
    step_s = job["on_step_s"]
    per_step = {k: plane[f"{k}_message_s"] * 2 for k in ("on", "off")}  # a step line and a heartbeat per step
    return {"job": job, "plane": plane, "control_plane_s_per_step": per_step,
            "plane_ratio": (step_s + per_step["on"]) / (step_s + per_step["off"])}


def _job_steps(root: Path, pairs: int, steps: int) -> dict[str, Any]:
    import hetauto
    import hetauto.launch.local as local
    from hetauto.testing.two_sites import write_two_site_plan

    (root / "timed").mkdir(parents=True)
    plan = write_two_site_plan(root / "timed", slow_ranks=1)
    with_token = local.control_token_file
    medians: dict[str, list[float]] = {"on": [], "off": []}
    for i in range(2 * pairs):
        mode = ("on", "off")[i % 2] if (i // 2) % 2 == 0 else ("off", "on")[i % 2]  # on off off on on off ...
        local.control_token_file = with_token if mode == "on" else (lambda _folder: "")
        try:
            doc = hetauto.run(plan, steps=steps, reference=False, timeout=30)
        finally:
            local.control_token_file = with_token
        medians[mode].append(statistics.median(doc["step_s"][2:]))
    on, off = statistics.median(medians["on"]), statistics.median(medians["off"])
    return {"on_step_s": on, "off_step_s": off, "ratio": on / off, "runs": medians}


def _plane_cost(messages: int) -> dict[str, Any]:
    from hetauto.launch.control import ControlServer

    secret = "ab" * 32
    times: dict[str, list[float]] = {"on": [], "off": [], "on_connect": [], "off_connect": []}
    with tempfile.TemporaryDirectory() as tmp, \
            ControlServer(Path(tmp) / "on", token=secret) as on, ControlServer(Path(tmp) / "off") as off:
        servers = {"on": (on, secret), "off": (off, None)}
        for block in range(10):
            for mode in (("on", "off") if block % 2 == 0 else ("off", "on")):
                server, token = servers[mode]
                started = time.perf_counter()
                client = ControlStoreClient("127.0.0.1", server.port, timeout_s=10, token=token, role="rank0")
                times[f"{mode}_connect"].append(time.perf_counter() - started)
                line = json.dumps({"rank": 0, "kind": "step", "text": json.dumps({"step": 1, "loss": 1.0})})
                started = time.perf_counter()
                for _ in range(messages // 10):
                    client.post(SEQ_KEY, MSG_PREFIX, line)
                    client.add(beat_key(0), 1)
                times[mode].append((time.perf_counter() - started) / (2 * (messages // 10)))
                client.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"on_message_s": med["on"], "off_message_s": med["off"], "message_ratio": med["on"] / med["off"],
            "on_connect_s": med["on_connect"], "off_connect_s": med["off_connect"]}


# --- RSS growth per step
def rss_growth(steps: int) -> dict[str, Any]:
    """A 1-rank tiny-gpt run of `steps` steps; its rank's RSS sampled twice a second with the steps done so far."""
    from hetauto.core.plan import Plan, StagePlan

    with tempfile.TemporaryDirectory() as tmp:
        plan, log = Path(tmp) / "plan.json", Path(tmp) / "steps.jsonl"
        Plan(model="tiny-gpt", cluster="cpu-demo", seq_len=16, global_batch=4, microbatch_size=2,
             num_microbatches=2, stages=(StagePlan(cluster="fast", device_type="cpu", devices=(0,), layers=(0, 6),
                                                   tp=1, dp=1),)).save(plan)
        mark = uuid.uuid4().hex
        env = {**os.environ, MARK_ENV: mark, "PYTHONPATH": str(ROOT)}
        with open(Path(tmp) / "out.json", "w+") as out_file, open(Path(tmp) / "err.txt", "w+") as err_file:
            proc = subprocess.Popen([sys.executable, "-m", "hetauto.cli", "run", str(plan), "--steps", str(steps),
                                     "--json", "--no-reference", "--timeout", "30", "--log-jsonl", str(log)],
                                    cwd=tmp, env=env, stdout=out_file, stderr=err_file,
                                    text=True)  # files: a full pipe would block it
            samples = _sample_rank_rss(proc, mark, log)
            out_file.seek(0)
            err_file.seek(0)
            out, err = out_file.read(), err_file.read()
    if proc.returncode != 0:
        return {"error": err.strip().splitlines()[-1:] or ["no output"]}
    step_s = statistics.fmean(json.loads(out)["step_s"])
    return {"steps": steps, "mean_step_s": step_s, **slope_per_step(samples, steps)}


def _sample_rank_rss(proc: subprocess.Popen, mark: str, log: Path) -> list[tuple[int, int]]:
    """(steps done, RSS KiB) of the job's rank twice a second until `proc` ends."""
    samples: list[tuple[int, int]] = []
    while proc.poll() is None:
        done = _read(str(log)).count("\n")
        for pid in _marked(mark):
            argv = _read(f"/proc/{pid}/cmdline").split("\0")
            if "hetauto.runtime.worker" in argv and "-c" not in argv[:2]:  # the rank, not torchrun (python -c ...)
                samples.append((done, _rss_kib(pid)))
        time.sleep(0.5)
    return samples


def slope_per_step(samples: list[tuple[int, int]], steps: int) -> dict[str, Any]:
    """Least-squares slope of RSS (KiB) over the steps done, from the first fifth of the steps (warm-up) to the
    last; the first and last RSS of that span."""
    kept = [(n, r) for n, r in samples if steps // 5 <= n < steps]
    if len(kept) < 5:
        return {"kib_per_step": None, "samples": len(samples)}
    ns, rs = [n for n, _ in kept], [r for _, r in kept]
    mn, mr = statistics.fmean(ns), statistics.fmean(rs)
    var = sum((n - mn) ** 2 for n in ns)
    slope = sum((n - mn) * (r - mr) for n, r in zip(ns, rs)) / var if var else 0.0
    return {"kib_per_step": slope, "rss_kib_first_last": [kept[0][1], kept[-1][1]], "steps_first_last":
            [kept[0][0], kept[-1][0]], "samples": len(kept)}


# --- a site lost: re-planned by the lead vs stopped and resumed by hand
def chaos(root: Path, steps: int, kill_at: int, grace_s: int) -> dict[str, Any]:
    """The three runs of part 4; each run's tokens are steps x global batch x sequence length."""
    from hetauto.testing.three_sites import write_three_site_plan

    plan = write_three_site_plan(_fresh(root / "plan"))
    clean = _chaos_run(root / "clean", plan, steps, None, grace_s, replan=True)
    lost = _chaos_run(root / "replan", plan, steps, kill_at, grace_s, replan=True)
    back = _chaos_run(root / "back", plan, steps, kill_at, grace_s, replan=True, again=True)
    by_hand = _by_hand(root / "by-hand", plan, steps, kill_at, grace_s)
    tokens = steps * 4 * 16
    doc = {"steps": steps, "kill_at": kill_at, "grace_s": grace_s, "tokens": tokens, "clean_s": clean["wall_s"],
           "replan_s": lost["wall_s"], "by_hand_s": by_hand["wall_s"], "exit_codes": lost["exit_codes"],
           "epochs": lost.get("epochs"), "max_loss_diff": lost.get("max_loss_diff")}
    for name in ("clean", "replan", "by_hand"):
        doc[f"{name}_tokens_s"] = tokens / doc[f"{name}_s"]
    doc["goodput_replan"] = doc["replan_tokens_s"] / doc["clean_tokens_s"]
    doc["goodput_by_hand"] = doc["by_hand_tokens_s"] / doc["clean_tokens_s"]
    if lost.get("epochs") and len(lost["epochs"]) > 1:
        doc["loss_to_first_step_s"] = lost["epochs"][1]["first_step_s"]
        doc["steps_lost"] = lost["epochs"][1]["redone"]
    doc["take_back_exit_codes"] = back["exit_codes"]
    if back.get("epochs") and len(back["epochs"]) > 2:  # epoch 2: site c taken back at a checkpoint
        doc["take_back_first_step_s"] = back["epochs"][2]["first_step_s"]
        doc["take_back_steps_redone"] = back["epochs"][2]["redone"]
        doc["take_back_loss_diff"] = back.get("max_loss_diff")
    return doc


def _fresh(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _launch_three(root: Path, plan: Path, steps: int, grace_s: int, *extra: str) -> Path:
    from hetauto.cli import main as cli
    from hetauto.testing.multiproc import two_free_ports

    import contextlib
    import io

    out = root / "out"
    with contextlib.redirect_stdout(io.StringIO()):  # its README: who runs what
        code = cli(["launch", str(plan), "--target", "torchrun", "--master", f"127.0.0.1:{two_free_ports()}", "-o",
                    str(out), "--steps", str(steps), "--timeout", str(grace_s), *extra])
    assert code == 0, f"hetauto launch exited {code}"
    return out


def _chaos_run(root: Path, plan: Path, steps: int, kill_at: int | None, grace_s: int, *, replan: bool,
               sites: tuple[str, ...] = ("a", "b", "c"), extra: tuple[str, ...] = (), again: bool = False
               ) -> dict[str, Any]:
    """One launch of `plan` run as written (site c killed at `kill_at` when given; `again`: its script run again
    once the lead has begun epoch 1, to be taken back): wall time, exits (the returned agent's last), result."""
    import signal as signals

    from hetauto.testing.three_sites import await_step, sites_running, submit_again

    out = _launch_three(_fresh(root), plan, steps, grace_s, "--checkpoint-dir", str(root / "ck"),
                        *(("--on-site-loss", "replan") if replan else ()), *extra)
    start = time.monotonic()
    with sites_running(out, root, sites) as procs:
        if kill_at is not None:
            await_step(root / "node0", procs[0], kill_at, 600)
            os.killpg(procs[2].pid, signals.SIGKILL)
        if again:
            procs.append(submit_again(out, root, root / "node0" / "epoch1"))
        try:
            codes = [p.wait(timeout=900) for p in procs]
        finally:
            if again and procs[-1].poll() is None:
                procs[-1].kill()
    doc: dict[str, Any] = {"wall_s": time.monotonic() - start, "exit_codes": codes, "ck": str(root / "ck")}
    result = root / "node0" / "result.json"
    if result.is_file():
        res = json.loads(result.read_text())
        doc.update(epochs=res.get("epochs"), max_loss_diff=res.get("max_loss_diff"))
    return doc


def _by_hand(root: Path, plan: Path, steps: int, kill_at: int, grace_s: int) -> dict[str, Any]:
    """The loss without the flag, then the operator's re-plan and resume on sites a and b."""
    from hetauto.launch.plan import LaunchPlan
    from hetauto.job.site_replan import replan

    failed = _chaos_run(root / "first", plan, steps, kill_at, grace_s, replan=False)
    begin = time.monotonic()
    launch = LaunchPlan.load(root / "first" / "out" / "launch.json")
    work = root / "first" / "node0"
    new_plan = replan(launch, launch.the_plan(), work, ["c"], seed=0)
    (work / "replanned.json").write_text(new_plan.model_dump_json(by_alias=True))
    planned_s = time.monotonic() - begin
    second = _chaos_run(root / "second", work / "replanned.json", steps, None, grace_s, replan=False,
                        sites=("a", "b"), extra=("--resume", failed["ck"]))
    return {"wall_s": failed["wall_s"] + planned_s + second["wall_s"], "exit_codes": [failed["exit_codes"],
                                                                                      second["exit_codes"]]}


# --- report
def format_report(doc: dict[str, Any]) -> str:
    lines = []
    att = doc.get("attacks")
    if att:
        lines.append("Attacks on the lead's control port (a real two-site job on this host):")
        for r in att["rows"]:
            lines.append(f"  {'refused' if r['refused'] else 'NOT REFUSED':<11} {r['when']:<15} {r['attack']}: "
                         f"{r['how']}")
        lines.append(f"  tried {att['tried']}, refused {att['refused']} ({100 * att['refused'] / att['tried']:.0f}%); "
                     f"the job trained on: {att['trained_on']} ({att['steps_trained']}/{att['steps']} steps, exits "
                     f"{att['exit_codes']}); the lead said {att['lead_refusal_lines']} refusal line(s); lead RSS "
                     f"{_mib(att['lead_rss_mib'][0])} -> {_mib(att['lead_rss_mib'][1])} MiB")
    cost = doc.get("auth")
    if cost:
        job, plane = cost["job"], cost["plane"]
        lines.append("Authentication's cost per step (on / off, side by side):")
        lines.append(f"  real 2-rank jobs: median step {job['on_step_s'] * 1e3:.2f} / {job['off_step_s'] * 1e3:.2f} ms,"
                     f" ratio {job['ratio']:.3f} (runs alternate; noise of a shared host included)")
        lines.append(f"  control plane: {plane['on_message_s'] * 1e6:.1f} / {plane['off_message_s'] * 1e6:.1f} us a "
                     f"message (ratio {plane['message_ratio']:.3f}); connect {plane['on_connect_s'] * 1e3:.2f} / "
                     f"{plane['off_connect_s'] * 1e3:.2f} ms (the challenge, once per connection); a step with its "
                     f"2 messages: ratio {cost['plane_ratio']:.4f}")
    rss = doc.get("rss")
    if rss:
        if "error" in rss:
            lines.append(f"RSS: the run failed: {rss['error']}")
        else:
            first, last = rss["rss_kib_first_last"]
            lines.append(f"RSS of the rank over {rss['steps']} steps ({rss['mean_step_s'] * 1e3:.1f} ms a step): "
                         f"{rss['kib_per_step']:.3f} KiB/step from step {rss['steps_first_last'][0]} to "
                         f"{rss['steps_first_last'][1]} ({first} -> {last} KiB)")
    ch = doc.get("chaos")
    if ch:
        lines.append(f"A site lost (three sites of one rank, {ch['steps']} steps, site c killed at step "
                     f"{ch['kill_at']}, grace {ch['grace_s']} s; exits {ch['exit_codes']}, max loss difference "
                     f"{ch['max_loss_diff']}):")
        lines.append(f"  loss to the first step on the new plan: {ch.get('loss_to_first_step_s')} s; steps of work "
                     f"lost: {ch.get('steps_lost')}")
        if ch.get("take_back_first_step_s") is not None:
            lines.append(f"  site c submitted again once epoch 1 began: taken back at a checkpoint, its return to the "
                         f"first step with it {ch['take_back_first_step_s']} s; steps redone "
                         f"{ch['take_back_steps_redone']}; exits {ch['take_back_exit_codes']}, max loss difference "
                         f"{ch['take_back_loss_diff']}")
        else:
            lines.append(f"  site c submitted again: not taken back (exits {ch.get('take_back_exit_codes')})")
        lines.append(f"  goodput vs the run without the fault ({ch['clean_s']:.1f} s): re-planned by the lead "
                     f"{100 * ch['goodput_replan']:.0f}% ({ch['replan_s']:.1f} s), stopped and resumed by hand "
                     f"{100 * ch['goodput_by_hand']:.0f}% ({ch['by_hand_s']:.1f} s, no human delay counted)")
    return "\n".join(lines)


def _mib(v: float | None) -> str:
    return "?" if v is None else f"{v:.0f}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="a larger flood, more timed runs, 2000 RSS steps")
    ap.add_argument("--json", action="store_true", help="only the JSON line")
    ap.add_argument("--only", choices=("attacks", "auth", "rss", "chaos"), help="one part only")
    args = ap.parse_args(argv)
    doc: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="hetauto-ops-") as tmp:
        root = Path(tmp)
        if args.only in (None, "attacks"):
            doc["attacks"] = run_attacks(root / "attacks", steps=60 if args.full else 30,
                                         flood=3000 if args.full else 300)
        if args.only in (None, "auth"):
            doc["auth"] = auth_cost(root / "auth", pairs=3 if args.full else 1, steps=40 if args.full else 20,
                                    messages=20000 if args.full else 4000)
        if args.only in (None, "rss"):
            doc["rss"] = rss_growth(2000 if args.full else 300)
        if args.only in (None, "chaos"):
            doc["chaos"] = chaos(root / "chaos", steps=16 if args.full else 8, kill_at=4 if args.full else 3,
                                 grace_s=10)
    if not args.json:
        print(format_report(doc))
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
