"""The run service: one code path from a request to a result for `hetauto run`, `hetauto launch`, `hetauto node`
and `hetauto.run()`.

`request` (what is asked: `JobRequest`), `prepare` (every check before launch; those of checkpoints in
`checkpoint_checks`; the ranks' run configuration built once in `options`), `service` (launch, follow, collect on
this host; the lead node's result), `result` (the result document, the loss against its reference), `predict`
(the planner's step time and MFU), `results` (rank reports into tables), `preflight` (this host's backends),
`sinks` (progress bar, TensorBoard).

It sits between the commands (argument parsing and printing) and what it drives: it may import core, backends,
the planner (lazily, for predictions), the runtime (the reference run, report formats) and launch; none of those
imports it (pyproject.toml [tool.importlinter]).
"""
