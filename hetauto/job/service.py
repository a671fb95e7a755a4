"""The run service after `prepare`: hold the checkpoint folder, check this host's backends, launch the ranks
(torchrun on this host, or one per network namespace), follow their steps, collect their reports, and build the
result document with its loss check (`run_local`); the lead node agent's result of a multi-site job
(`node_result`).

Why one module: `hetauto run` and `hetauto.run()` run a plan through `run_local`, and the lead of `hetauto node`
reports through `node_result`: one code path, so the three cannot drift. Nothing here prints to stdout; notes go
through the request's `warn`.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from hetauto.job.prepare import PreparedJob
from hetauto.job.sinks import StepSink

if TYPE_CHECKING:
    from hetauto.launch.node import NodeJob

__all__ = ["run_local", "node_result", "OpenSinks"]

OpenSinks = Callable[[], Sequence[StepSink]]  # called once the ranks have started


def run_local(job: PreparedJob, *, open_sinks: OpenSinks | None = None) -> dict[str, Any]:
    """Train a prepared job on this host; returns the result document, its `loss_off_reference` set (None when
    the losses kept to the reference). The checkpoint folder is this run's alone while it runs (a second run is
    refused before anything starts)."""
    if job.options.checkpoint.dir is None:
        return _execute(job, open_sinks)
    from hetauto.launch.folder_lock import acquire_folder

    with acquire_folder(job.options.checkpoint.dir) as lock:
        if lock.took_over is not None:
            job.request.warn(f"hetauto run: note: took over {job.request.flag('checkpoint_dir')} "
                             f"{job.request.checkpoint_dir} from a run that is gone ({lock.took_over.describe()})")
        return _execute(job, open_sinks)


def _execute(job: PreparedJob, open_sinks: OpenSinks | None) -> dict[str, Any]:
    """The host's backends, the launch, the result document and its loss check."""
    from hetauto.job.preflight import check_backends
    from hetauto.job.result import result_document, wants_reference

    req = job.request
    pre = check_backends(job.plan, job.cluster, emulate=bool(req.emulate))
    options = job.options.with_emulation(backends=pre.backends)
    if pre.mock_devices is not None:
        os.environ["HETAUTO_MOCK_DEVICES"] = str(pre.mock_devices)  # the workers inherit it
    want_reference = wants_reference(job.cfg, req.reference)
    reports, link = _launch(replace(job, options=options), want_reference, open_sinks)
    doc = result_document(job.plan, job.cfg, reports, options, base=job.base, emulate=req.emulate,
                          want_reference=want_reference, link=link, trace=req.trace,
                          emulated_backends=tuple({"stage": i, "backend": was, "runs_on": pre.backends[i]}
                                                  for i, was in pre.emulated))
    return _checked(doc, options)


def _checked(doc: dict[str, Any], options: Any) -> dict[str, Any]:
    """`doc` with `loss_off_reference`: a run whose loss leaves its reference's tolerance trained something else
    than the model it claims to (a tie broken across stages, wrong data, a bug); a changed data stream
    (--allow-data-change) has no reference to keep to."""
    from hetauto.job.result import loss_off_reference

    doc["loss_off_reference"] = None if options.checkpoint.allow_data_change else loss_off_reference(
        doc["loss"], doc["reference_loss"], doc["start_step"], doc["loss_tolerance"])
    return doc


def _launch(job: PreparedJob, want_reference: bool,
            open_sinks: OpenSinks | None) -> tuple[list[dict[str, Any]], dict | None]:
    """Start the job (netns sites or torchrun on this host), follow its steps, wait: (rank reports, the shaped
    link's figures under netns)."""
    if job.request.emulate == "netns":
        from hetauto.launch.netns import launch_netns

        return launch_netns(job.plan, job.cluster, job.options)
    from hetauto.job.predict import flops_per_peak
    from hetauto.launch.local import start_local

    peak = flops_per_peak(job.plan, job.base)  # a step's MFU is this over its step time
    running = start_local(job.plan, job.options, max_restarts=job.request.max_restarts)
    sinks = list(open_sinks()) if open_sinks is not None else []
    on_step = (lambda rec: [s.add(rec) for s in sinks]) if sinks else None
    running.follow_steps(job.request.log_jsonl, on_step, peak)
    if want_reference:
        try:
            # Import torch here while the ranks start (they import it too, which takes longer than this):
            # nothing torch-heavy ran before the launch, and nothing heavy runs here while they train.
            _import_for_reference()
        except BaseException:
            running.kill()
            raise
    try:
        return running.wait(), None
    finally:
        for sink in sinks:
            sink.close()


def _import_for_reference() -> None:
    import torch  # noqa: F401

    import hetauto.runtime.reference  # noqa: F401


def node_result(job: "NodeJob", reports: list[dict[str, Any]], *, reference: bool) -> dict[str, Any]:
    """The lead node agent's result document of a multi-site job (hetauto run's, plus where it ran), its
    `loss_off_reference` set as hetauto run sets it."""
    from hetauto.core.plan_check import load_model_for_plan
    from hetauto.job.result import result_document, wants_reference

    cfg = load_model_for_plan(job.plan)
    if job.run.island.active:  # one island of an island plan's launch: the island reference, its outer syncs
        from hetauto.job.island_node import island_node_result

        doc = island_node_result(job, cfg, reports, reference=reference)
    else:
        doc = result_document(job.plan, cfg, reports, job.run, base=Path(job.workdir), emulate=None,
                              want_reference=wants_reference(cfg, reference))
    doc["launch"] = {"plan_sha256": job.launch.plan_sha256, "sites": [s.name for s in job.launch.sites],
                     "nodes": job.launch.num_nodes}
    return _checked(doc, job.run)
