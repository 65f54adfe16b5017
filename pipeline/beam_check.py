"""Checks, before any component, that the Beam runner's workers start and can import the
pipeline: a Beam job whose workers never start does not fail, it waits forever."""

from __future__ import annotations

import logging
from typing import List

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, PortableOptions, StandardOptions


class BeamWorkersError(RuntimeError):
    """The Beam workers did not start, or started without what the pipeline needs."""


def needs_check(args: List[str]) -> bool:
    """False for Beam's FnApiRunner, whose workers are this process or its own children
    (started with this Python); True for every runner with workers of their own."""
    return PipelineOptions(args).view_as(StandardOptions).runner != "FnApiRunner"


def _import_pipeline(_):
    # Runs on a worker: what each Beam component of the pipeline imports there.
    import tensorflow  # noqa: F401
    import tfx  # noqa: F401

    import keras_vit  # noqa: F401
    import pipeline.components  # noqa: F401
    return 1


def check_workers(args: List[str], timeout_s: float) -> None:
    """Runs a one-element job with the pipeline's Beam `args` whose worker imports
    TensorFlow, TFX, keras_vit and the pipeline.

    Raises:
      BeamWorkersError: the job failed (the worker's error is in the message) or did not
        finish within `timeout_s` (it is cancelled first).
    """
    options = PipelineOptions(args)
    where = options.view_as(StandardOptions).runner or "DirectRunner"
    portable = options.view_as(PortableOptions)
    if portable.environment_type:
        where += f" with {portable.environment_type} workers"
        if portable.environment_config:
            where += f" at {portable.environment_config}"
    p = beam.Pipeline(options=options)
    _ = p | "One" >> beam.Create([0]) | "ImportPipeline" >> beam.Map(_import_pipeline)
    try:
        result = p.run()
        state = result.wait_until_finish(duration=int(timeout_s * 1000))
    except Exception as e:  # the runner's own error, with the worker's traceback in it
        raise BeamWorkersError(f"the Beam check job on {where} failed: {e}") from e
    if state != beam.runners.runner.PipelineState.DONE:
        try:
            result.cancel()
        except Exception as e:  # already gone; the timeout is the news
            logging.info("cancelling the Beam check job: %s", e)
        raise BeamWorkersError(
            f"the Beam workers on {where} did not run a one-element job within {timeout_s:g} s (state "
            f"{state}). A worker that cannot start makes Beam wait forever: check that the workers' "
            "`python` has this project's environment (apache_beam, TFX, keras_vit on its path)")
