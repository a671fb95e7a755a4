"""Every hostile input (benchmarks/hostile_inputs.py's table, hetauto.testing.hostile_table) gets a clean answer:
a one-line refusal naming what is wrong, never a traceback, a hang, a silent acceptance or a damaged input."""

from __future__ import annotations

from hetauto.testing.hostile import CLASSES, Case, counts, run_cases
from hetauto.testing.hostile_table import all_cases, base


def test_the_table_covers_every_command_and_the_api_with_at_least_150_cases() -> None:
    from hetauto.cli import COMMANDS

    cases = all_cases()
    assert len(cases) >= 150
    assert set(COMMANDS) | {"api"} <= {c.command for c in cases}
    assert len({(c.command, c.name) for c in cases}) == len(cases)  # names are unique: a failure names one case


def test_every_hostile_input_is_answered_cleanly() -> None:
    import os

    before = dict(os.environ)
    outcomes = run_cases(all_cases(), base)
    # commands run in-process here; what they set for their own process (`hetauto node`: TORCH_CPP_LOG_LEVEL)
    # must not reach the processes later tests start
    assert dict(os.environ) == before
    bad = [o for o in outcomes if o.klass != "clean"]
    report = "\n\n".join(f"[{o.klass}] {o.case.command}: {o.case.name}\n  argv: {o.case.argv}\n  {o.message}\n"
                         + o.output[-2000:] for o in bad)
    assert not bad, f"{len(bad)} of {len(outcomes)} cases not clean ({counts(outcomes)['by_class']}):\n{report}"


def test_the_classifier_sees_each_class() -> None:
    """The probe itself: a refusal without the named word is unclear, exit 0 on bad input is a silent
    acceptance, an escaping exception a traceback, a changed protected file damage, a stuck call a hang."""
    import time

    def boom() -> None:
        raise ZeroDivisionError("x")

    def sleepy() -> None:
        time.sleep(5)

    def write() -> None:
        open("text.txt", "w").write("gone")

    cases = [Case("t", "refusal", argv=("plan", "--scenario", "nosuch"), mention=("nosuch",)),
             Case("t", "vague", argv=("plan", "--scenario", "nosuch"), mention=("cluster.yaml",)),
             Case("t", "accepted", call=lambda: None),
             Case("t", "crash", call=boom),
             Case("t", "damage", call=write, protect=("text.txt",), accept=True),
             Case("t", "stuck", call=sleepy, timeout=0.2)]
    got = [o.klass for o in run_cases(cases, base)]
    assert got == ["clean", "unclear", "silently-accepted", "traceback", "silently-accepted", "hang"]
    assert set(got) <= set(CLASSES)
