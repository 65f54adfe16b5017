"""Exclusive time per op type or graph node, from a TF profiler trace (`benchmarks/op_profile.py`)."""

from __future__ import annotations

import collections
import glob
import os
from typing import Dict

_ASYNC_START = "ExecutorState::ProcessAsync::Start"


def _label(name: str, stats: Dict[str, str], by: str):
    """The row an event counts towards, or None for executor bookkeeping."""
    if name == _ASYNC_START:
        node, kind = stats.get("name", "?"), stats.get("kernel_type", "?")
    elif ":" in name and "::" not in name:
        node, kind = name.rsplit(":", 1)
    else:
        return None
    return kind if by == "type" else f"{node} ({kind})"


def op_times(xspace, by: str = "type") -> Dict[str, float]:
    """Exclusive seconds per op type (or `node (type)`) over the executor threads of a trace.

    Args:
      xspace: a `tensorflow.tsl.profiler.protobuf.xplane_pb2.XSpace`.
      by: "type" or "node".
    """
    if by not in ("type", "node"):
        raise ValueError(f"by must be 'type' or 'node', got {by!r}")
    seconds = collections.Counter()
    for plane in xspace.planes:
        names = plane.stat_metadata
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            open_events = []  # (end_ps, label) of the enclosing counted events
            for event in sorted(line.events, key=lambda e: (e.offset_ps, -e.duration_ps)):
                name = plane.event_metadata[event.metadata_id].name
                stats = {} if name != _ASYNC_START else {
                    names[s.metadata_id].name: names[s.ref_value].name if s.ref_value else s.str_value
                    for s in event.stats}
                label = _label(name, stats, by)
                if label is None:
                    continue
                while open_events and open_events[-1][0] <= event.offset_ps:
                    open_events.pop()
                if open_events:
                    seconds[open_events[-1][1]] -= event.duration_ps * 1e-12
                seconds[label] += event.duration_ps * 1e-12
                open_events.append((event.offset_ps + event.duration_ps, label))
    return dict(seconds)


def trace(call, calls: int, trace_dir: str):
    """Runs `call` `calls` times under TF's profiler, each to completion, and returns the trace's XSpace."""
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    from benchmarks import measure

    tf.profiler.experimental.start(trace_dir)
    try:
        for _ in range(calls):
            measure.wait_for(call())
    finally:
        tf.profiler.experimental.stop()
    paths = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    paths.sort(key=os.path.getmtime)
    if not paths:
        raise RuntimeError(f"the profiler wrote no trace under {trace_dir}")
    xspace = xplane_pb2.XSpace()
    with open(paths[-1], "rb") as f:
        xspace.ParseFromString(f.read())
    return xspace
