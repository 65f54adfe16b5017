"""Timing helpers the benchmarks share: the machine's matmul peak, a timer, keras-hub's ViT, peak RSS.

Every figure a benchmark prints is measured in the same process as the ones it is
compared with, so that ratios survive a shared, noisy machine.
"""

from __future__ import annotations

import gc
import resource
import time
from typing import Callable, Dict, Tuple

import numpy as np


def best_seconds(fn: Callable[[], object], min_seconds: float = 2.0, min_iterations: int = 3,
                 warmup: int = 1) -> float:
    """The fastest of repeated calls of `fn` (after `warmup` untimed calls), in seconds.

    The minimum, not the mean: on a shared machine noise only ever adds time.
    """
    return float(interleaved_times({"fn": fn}, min_seconds, min_iterations, warmup)["fn"].min())


def interleaved_times(cases: Dict[str, Callable[[], object]], min_seconds: float = 2.0, min_rounds: int = 3,
                      warmup: int = 1) -> Dict[str, np.ndarray]:
    """Every timed call of each case, in seconds, `[rounds]` per case, round by round.

    Round r calls the cases in order, round r + 1 in reverse, until every case has had
    `min_rounds` calls and `min_seconds` have passed in all. Timed one after the other,
    a drift in the machine's load lands on one case only; interleaved, on both, and the
    calls of one round can be compared with each other (`speedup`).
    """
    for fn in cases.values():
        for _ in range(warmup):
            wait_for(fn())
    times = {name: [] for name in cases}
    order = list(cases)
    start = time.perf_counter()
    while len(times[order[0]]) < min_rounds or time.perf_counter() - start < min_seconds:
        for name in order:
            t = time.perf_counter()
            wait_for(cases[name]())
            times[name].append(time.perf_counter() - t)
        order.reverse()
    return {name: np.asarray(t) for name, t in times.items()}


def speedup(base_seconds, new_seconds, confidence: float = 0.9, resamples: int = 2000,
            seed: int = 0) -> Tuple[float, float, float]:
    """How much faster `new` ran than `base`: the median over rounds of base / new, and
    a bootstrap interval of that median at `confidence`, as `(median, low, high)`.

    Both are `[rounds]` times from `interleaved_times`; round r's two calls ran next to
    each other, so their ratio carries little of the machine's drift. Two identical
    ViT-Ti/16 models on 2 shared cores (bf16, batch 32): a round's ratio ranged
    0.87-1.11 (10th to 90th percentile), the fastest of 10 calls of each differed by up
    to 8% between runs, the median of 60 paired ratios by at most 1.1%. An interval
    that holds 1 means the two were not told apart.
    """
    base, new = np.asarray(base_seconds, dtype=float), np.asarray(new_seconds, dtype=float)
    if base.shape != new.shape or base.ndim != 1 or not len(base):
        raise ValueError(f"need the same number of rounds for both, got {base.shape} and {new.shape}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    ratios = base / new
    picks = np.random.default_rng(seed).integers(0, len(ratios), (resamples, len(ratios)))
    medians = np.median(ratios[picks], axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(medians, [tail, 1 - tail])
    return float(np.median(ratios)), float(low), float(high)


def fastest_per_round(*variants) -> np.ndarray:
    """Each round's fastest of one model's `variants` (`[rounds]` times from one
    `interleaved_times`, e.g. the model with XLA off and on): `[rounds]`. Two such
    series pair round by round in `speedup`, so "each at its best setting" gets an
    interval too."""
    arrays = [np.asarray(v, dtype=float) for v in variants]
    if not arrays or any(a.ndim != 1 or a.shape != arrays[0].shape for a in arrays):
        raise ValueError(f"need equal [rounds] series, got shapes {[a.shape for a in arrays]}")
    return np.minimum.reduce(arrays)


def format_speedup(estimate: Tuple[float, float, float]) -> str:
    """`1.05x (1.01-1.09)`: a `speedup` with its interval."""
    median, low, high = estimate
    return f"{median:.3f}x ({low:.3f}-{high:.3f})"


BEST_HEADER = ("| model | precision | batch | ours img/s | keras-hub img/s | ours / keras-hub (90% interval) "
               "| ours % of peak |\n|---|---|---:|---:|---:|---:|---:|")


def best_row(name, precision, batch, ours_times, hub_times, flops_per_image, peak_flops) -> str:
    """The best-of table's row from each model's per-round times at its best XLA setting
    (`measure.fastest_per_round`): img/s of the fastest calls, the paired ratio with its
    interval, and ours as a share of `peak_flops`."""
    ours, hub = batch / np.min(ours_times), batch / np.min(hub_times)
    estimate = speedup(hub_times, ours_times)
    return (f"| {name} | {precision} | {batch} | {ours:.1f} | {hub:.1f} | {format_speedup(estimate)} "
            f"| {100 * ours * flops_per_image / peak_flops:.0f}% |")


def fresh_models(build: Callable[[], Dict[str, object]], policy: str) -> Dict[str, object]:
    """Builds a case's models (`build()` returns them by name) in a cleared Keras session
    under the dtype policy `policy`.

    `keras.backend.clear_session()` also resets the global dtype policy to float32, so
    the policy is set after it, and every model is checked to have been built under it.
    (Until this was shared, every mixed_bfloat16 case of `vit_throughput` but the
    first of each model ran in float32.)
    """
    import keras

    keras.backend.clear_session()
    gc.collect()
    keras.mixed_precision.set_global_policy(policy)
    models = build()
    for name, model in models.items():
        if model.dtype_policy.name != policy:
            raise RuntimeError(f"{name} was built under {model.dtype_policy.name}, not {policy}")
    return models


def model_call(model, images, labels, mode: str = "inference", jit: bool = False) -> Callable[[], object]:
    """A zero-argument call to time: a forward pass (returns the logits) or a training step.

    `mode` "inference" runs `model.predict_step(images)` (what `model.predict` runs:
    `model(images, training=False)`, under the model's own step) in a tf.function; "train"
    compiles `model` with AdamW and sparse cross-entropy on logits and runs
    `train_on_batch(images, labels)`. `jit` XLA-compiles either.
    """
    import tensorflow as tf

    if mode == "inference":
        forward = tf.function(model.predict_step, jit_compile=jit, reduce_retracing=True)
        return lambda: forward(images)
    if mode != "train":
        raise ValueError(f"mode must be 'inference' or 'train', got {mode!r}")
    import keras

    model.compile(optimizer=keras.optimizers.AdamW(1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=jit)
    return lambda: model.train_on_batch(images, labels)


def wait_for(result):
    """Waits for a result by fetching one element of each tensor in it (returned, a list).

    `.numpy()` of a whole tensor copies it into a fresh array: 15 ms for a
    `[6304, 3072]` float32 tensor here, more than computing it, which would add a
    constant to every large-output case and understate the matmul peak. A one-element
    slice still waits for the kernel that made the tensor, on any device.
    """
    import tensorflow as tf

    return [tf.reshape(leaf, [-1])[:1].numpy() for leaf in tf.nest.flatten(result)
            if isinstance(leaf, (tf.Tensor, tf.Variable))]


def matmul_peak(dtypes=("float32", "bfloat16"), n: int = 2048, min_seconds: float = 2.0) -> Dict[str, float]:
    """FLOP/s of an `n x n` matmul per dtype: the machine's practical peak for dense layers.

    The better of TF's own kernel (oneDNN) and XLA's, since models are timed both ways
    and a share of a lower peak could pass 100%.
    """
    import tensorflow as tf

    out = {}
    for dtype in dtypes:
        a = tf.cast(tf.random.normal((n, n), dtype=tf.float32), dtype)
        b = tf.cast(tf.random.normal((n, n), dtype=tf.float32), dtype)
        rates = []
        for jit in (False, True):
            # The whole product is returned: XLA would shrink a sliced or reduced one.
            f = tf.function(lambda: tf.matmul(a, b), jit_compile=jit)
            rates.append(2.0 * n ** 3 / best_seconds(f, min_seconds))
        out[dtype] = max(rates)
    return out


def keras_hub_vit(config, num_classes: int = 0):
    """keras-hub's `ViTBackbone` of the same architecture as a keras_vit config.

    With `num_classes`, the class token goes through a Dense head as in ours.
    Raises ImportError with the install command when the bench extra is missing.
    """
    try:
        import keras_hub
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("keras-hub is a benchmark-only extra: run `make bench` (it installs "
                          "requirements/bench-lock.txt into .venv-bench)") from e
    import keras

    c = config
    if c.resnet is not None or c.classifier != "token":
        raise ValueError(f"keras-hub's ViTBackbone has no counterpart of {c.name}")
    backbone = keras_hub.models.ViTBackbone(
        image_shape=(*c.image_size, c.num_channels), patch_size=c.patch_size[0], num_layers=c.num_layers,
        num_heads=c.num_heads, hidden_dim=c.hidden_size, mlp_dim=c.mlp_dim,
        layer_norm_epsilon=c.layer_norm_epsilon)
    if not num_classes:
        return backbone
    images = keras.Input((*c.image_size, c.num_channels))
    logits = keras.layers.Dense(num_classes, dtype="float32")(backbone(images)[:, 0])
    return keras.Model(images, logits)


def conv_dense_macs(model) -> int:
    """MACs of the Conv2D and Dense layers of a functional Keras model (fvcore's convention)."""
    import keras

    total = 0
    for layer in model.layers:
        if isinstance(layer, keras.layers.Conv2D):
            _, h, w, cout = layer.output.shape
            kh, kw, cin, _ = layer.kernel.shape
            total += h * w * cout * kh * kw * cin
        elif isinstance(layer, keras.layers.Dense):
            total += int(np.prod(layer.kernel.shape))
    return int(total)


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
