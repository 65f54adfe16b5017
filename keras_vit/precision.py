"""Choosing the Keras dtype policy: `auto` picks bf16 only where the hardware runs it fast."""

from __future__ import annotations

import keras
import tensorflow as tf
from absl import logging

from keras_vit import hardware

PRECISIONS = ("auto", "float32", "mixed_bfloat16", "mixed_float16")


def gpu_compute_capabilities() -> list:
    """The major compute capability of each visible GPU."""
    return [tf.config.experimental.get_device_details(g).get("compute_capability", (0, 0))[0]
            for g in tf.config.list_physical_devices("GPU")]


def resolve_precision(precision: str = "auto", flags=None, gpus=None, onednn_bf16=None) -> str:
    """The policy name for `precision`.

    `auto`: mixed_bfloat16 on GPUs of compute capability 8+ (mixed_float16 on older
    ones) and on CPUs with AMX-BF16 or AVX512-BF16 where TF's oneDNN runs bfloat16;
    float32 otherwise. `flags` (CPU flags), `gpus` (major compute capabilities) and
    `onednn_bf16` default to this machine's (see `keras_vit.hardware`).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision != "auto":
        return precision
    gpus = gpu_compute_capabilities() if gpus is None else gpus
    if gpus:
        return "mixed_bfloat16" if min(gpus) >= 8 else "mixed_float16"
    return "mixed_bfloat16" if hardware.has_fast_bf16_cpu(flags, onednn_bf16) else "float32"


def set_precision(precision: str = "auto") -> str:
    """Sets the global Keras policy and says which it picked; returns the policy name."""
    policy = resolve_precision(precision)
    keras.mixed_precision.set_global_policy(policy)
    why = ""
    if precision == "auto":
        why = f" (auto: {_why_auto(policy)})"
    logging.info("precision: %s%s", policy, why)
    print(f"precision: {policy}{why}", flush=True)
    return policy


def _why_auto(policy: str) -> str:
    if policy != "float32":
        return "bf16-capable hardware found"
    if hardware.bf16_instructions():
        return "no GPU, and TF's oneDNN does not run bfloat16 here (TF_ENABLE_ONEDNN_OPTS=0?)"
    return f"no GPU, and {hardware.describe()} cores have no AMX-BF16 or AVX512-BF16"


def with_policy(model, policy: str):
    """The same ViT (config and weights) with every layer under the dtype policy `policy`."""
    from keras_vit.vit import VisionTransformer, create_model

    if not isinstance(model, VisionTransformer):
        raise TypeError(f"with_policy needs a keras_vit VisionTransformer, got {type(model).__name__}")
    twin = create_model(model.config, dtype=policy)
    twin.set_weights(model.get_weights())
    return twin


def to_precision(model, precision: str):
    """`model` computing under `precision` (one of PRECISIONS; `auto` is resolved for
    this machine): `model` itself if it already does, else its `with_policy` twin."""
    policy = resolve_precision(precision)
    return model if policy == model_policy(model) else with_policy(model, policy)


def model_policy(model) -> str:
    """The dtype policy a model's layers compute in (a ViT's head is float32 under any)."""
    from keras_vit.vit import VisionTransformer

    return (model.patch_embed if isinstance(model, VisionTransformer) else model).dtype_policy.name


def compute_dtype_twin(model):
    """For inference: `model` with its weights stored in its compute dtype.

    Under a mixed policy (mixed_bfloat16, mixed_float16) every layer keeps float32
    weights and casts them to the compute dtype at each call. The twin (same config,
    layers under the plain compute-dtype policy, the head still float32) holds them
    already cast, so its outputs are bit-identical to `model`'s, its weights take half
    the memory, and the per-call casts are gone (docs/performance.md). A float32 model, or one that is not a
    `VisionTransformer`, comes back as it is. Not for training: the optimizer would
    then update bf16 weights.
    """
    from keras_vit.vit import VisionTransformer

    if not isinstance(model, VisionTransformer):
        return model
    policy = keras.DTypePolicy(model_policy(model))
    if policy.variable_dtype == policy.compute_dtype:
        return model
    return with_policy(model, policy.compute_dtype)


def top1_agreement(model, twin, images, batch_size: int = 64):
    """How often `model` and `twin` (usually `with_policy(model, ...)`) pick the same class.

    Args:
      model, twin: classifiers of the same images, e.g. a float32-trained
        `VisionTransformer` and its mixed_bfloat16 twin.
      images: `[N, H, W, C]` in [-1, 1].
    Returns:
      (agreement in [0, 1], logits `[N, classes]` of `model`, logits of `twin`).
    """
    if not len(images):
        raise ValueError("top1_agreement needs at least one image")
    ours = model.predict(images, batch_size=batch_size, verbose=0)
    theirs = twin.predict(images, batch_size=batch_size, verbose=0)
    return float((ours.argmax(-1) == theirs.argmax(-1)).mean()), ours, theirs
