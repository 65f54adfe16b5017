"""Which kind of graph a layer is being traced into, for ops whose fastest form differs."""

from __future__ import annotations

import contextlib
import threading

import tensorflow as tf

from keras_vit import hardware

_traces = threading.local()


def compiling_with_xla() -> bool:
    """True while tracing inside a `tf.function(jit_compile=True)`, Keras's
    `jit_compile=True` included: XLA then fuses elementwise work itself and maps
    float32 softmaxes to oneDNN's, so the forms written for TF's own executor lose."""
    from tensorflow.python.framework import ops as tf_ops
    from tensorflow.python.ops import control_flow_util

    if tf.executing_eagerly():
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf_ops.get_default_graph()))


def onednn_inference(training, dtype) -> bool:
    """True when a call at inference is traced for TF's own executor and TF hands the
    graph's `dtype` ops to oneDNN (`hardware.onednn_runs`): where the layers take the
    graph forms that oneDNN's rewrites run fastest. Elsewhere (AVX2-only cores, where
    TF's oneDNN is off by default) they keep the plain forms."""
    return not training and not compiling_with_xla() and hardware.onednn_runs(dtype)


@contextlib.contextmanager
def never_saved():
    """Marks what is traced inside as a graph Keras runs in this process and never
    saves: `VisionTransformer.predict_step` and `test_step`."""
    _traces.never_saved = getattr(_traces, "never_saved", 0) + 1
    try:
        yield
    finally:
        _traces.never_saved -= 1


def xla_kernels_allowed() -> bool:
    """True where an inference graph may call XLA-compiled kernels: eagerly, or in a
    trace under `never_saved`. Any other trace may end up in a SavedModel, and TF
    Serving's CPU build refuses to run XLA kernels unless started with
    --xla_cpu_compilation_enabled."""
    return tf.executing_eagerly() or getattr(_traces, "never_saved", 0) > 0
