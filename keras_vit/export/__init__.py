"""SavedModel export for TF Serving: encoded images in, probabilities and class names out.

`export_saved_model` writes `<base>/<version>/`, the layout TF Serving polls, with
three signatures, warmup requests and a `models.config` beside the model
directories. The SavedModel needs neither keras_vit nor custom objects to load.
`python -m keras_vit.export` is its command line (`keras_vit/export/__main__.py`).
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

import keras
import numpy as np
import tensorflow as tf

from keras_vit import batching, extras, precision, preprocessing, storage

SIGNATURES = ("serving_default", "serving_examples", "predict_images")
IMAGE_FEATURE = "image"


def _model_image_shape(model):
    shape = model.inputs[0].shape
    if len(shape) != 4 or None in shape[1:]:
        raise ValueError(f"the model must take fixed-size NHWC images, its input is {shape}")
    return tuple(shape[1:3]), shape[3]


def next_version(base: str) -> int:
    """One more than the highest integer version directory under `base` (1 if none)."""
    names = storage.listdir(base) if storage.isdir(base) else []
    return max([int(d) for d in names if d.isdigit()], default=0) + 1


class _ServingGraph:
    """The three signature functions over one model, sharing the output head.

    `class_names` None: the model outputs features, which are served as they are.
    """

    def __init__(self, model, class_names, image_size, channels, top_k, activation, max_pixels):
        self.model = model
        self.max_pixels = max_pixels
        self.image_size = image_size
        self.channels = channels
        self.top_k = top_k
        self.activation = activation
        self.class_names = None if class_names is None else tf.constant(class_names)

    def outputs(self, images):
        logits = tf.cast(self.model(images, training=False), tf.float32)
        if self.class_names is None:
            return {"features": logits}
        probs = tf.nn.softmax(logits, axis=-1) if self.activation == "softmax" else tf.sigmoid(logits)
        classes = tf.argmax(probs, axis=-1, output_type=tf.int64)
        top = tf.math.top_k(probs, k=self.top_k)
        return {
            "probabilities": probs,
            "classes": classes,
            "class_names": tf.gather(self.class_names, classes),
            "top_k_classes": tf.cast(top.indices, tf.int64),
            "top_k_probabilities": top.values,
        }

    def from_bytes(self, image_bytes, input_name):
        images = preprocessing.decode_batch_for_eval(image_bytes, self.image_size, self.channels, input_name,
                                                     self.max_pixels)
        return self.outputs(images)

    def serving_default(self, image_bytes):
        return self.from_bytes(image_bytes, "image_bytes")

    def serving_examples(self, examples):
        features = tf.io.parse_example(examples, {IMAGE_FEATURE: tf.io.FixedLenFeature([], tf.string)})
        return self.from_bytes(features[IMAGE_FEATURE], f"examples.{IMAGE_FEATURE}")

    def predict_images(self, images):
        return self.outputs(images)


def export_saved_model(
    model: keras.Model,
    path: str,
    class_names: Optional[Sequence[str]] = None,
    image_size=None,
    version: Optional[int] = None,
    top_k: int = 5,
    activation: str = "softmax",
    warmup: bool = True,
    models_config_prefix: Optional[str] = None,
    weights_in_compute_dtype: bool = True,
    max_pixels: int = preprocessing.DEFAULT_MAX_PIXELS,
    tune_batching: bool = True,
) -> str:
    """Writes `model` as a TF Serving SavedModel under `path/<version>/`.

    Signatures (all return `probabilities` float32 [N, C], `classes` int64 [N],
    `class_names` string [N], `top_k_classes` int64 [N, k], `top_k_probabilities`
    float32 [N, k], k = min(top_k, C); for a keras_vit model without a head,
    `num_classes=0`, they return its pre-logits `features` float32 [N, D] instead):
      - `serving_default`: `image_bytes` string [N], encoded JPEG/PNG/GIF/BMP; decoded,
        converted to RGB, resized and scaled to [-1, 1] in the graph. An image whose
        header declares more than `max_pixels`, or none, is refused (InvalidArgument
        naming `image_bytes[i]`) before it is decoded; a large JPEG is decoded at 1/2,
        1/4 or 1/8 scale, never below the model's input size.
      - `serving_examples`: `examples` string [N], serialized tf.Example with an
        `image` bytes feature (for TFMA and InfraValidator).
      - `predict_images`: `images` float32 [N, H, W, C], already preprocessed.

    Args:
      model: a Keras model taking fixed-size `[N, H, W, C]` images in [-1, 1].
      path: the model's base directory, e.g. `saved_models/vit_b16`.
      class_names: C names; default "0" ... "C-1".
      image_size: the size images are resized to; must equal the model's input.
      version: integer version; default one more than the highest under `path`.
      top_k: how many classes the top-k outputs hold.
      activation: "softmax", or "sigmoid" for models trained with a sigmoid loss.
      warmup: write `assets.extra/tf_serving_warmup_requests`.
      models_config_prefix: base-path prefix in `models.config` (e.g. "/models" where
        the server sees `path`'s parent there); default the absolute local path.
      weights_in_compute_dtype: for a ViT under a mixed policy, store the weights in
        the compute dtype (`precision.compute_dtype_twin`): the same outputs bit for
        bit, half the size, and faster at small batches.
      max_pixels: the most pixels a served image may declare (default 200 million, a
        200 MP phone photo).
      tune_batching: time the written model at growing batch sizes and write TF
        Serving's `batching_parameters.txt` beside `models.config` (`keras_vit.batching`).

    Returns:
      The version directory written.
    """
    storage.check(path)
    version = next_version(path) if version is None else int(version)
    storage.makedirs(path)
    final = storage.publish(storage.join(path, str(version)), lambda staging: write_saved_model(
        model, staging, class_names=class_names, image_size=image_size, top_k=top_k, activation=activation,
        warmup=warmup, model_name=storage.basename(path), weights_in_compute_dtype=weights_in_compute_dtype,
        max_pixels=max_pixels))
    write_models_config(storage.parent(path), models_config_prefix)
    if tune_batching:
        batching.tune(final)
    return final


def write_saved_model(
    model: keras.Model,
    directory: str,
    class_names: Optional[Sequence[str]] = None,
    image_size=None,
    top_k: int = 5,
    activation: str = "softmax",
    warmup: bool = True,
    model_name: str = "model",
    weights_in_compute_dtype: bool = True,
    max_pixels: int = preprocessing.DEFAULT_MAX_PIXELS,
) -> str:
    """Writes the SavedModel of `export_saved_model` at exactly `directory` (no version
    folder), e.g. a TFX Trainer's `serving_model_dir`. `model_name` goes into the
    warmup requests. The directory must not exist or be empty."""
    size, channels = _model_image_shape(model)
    if image_size is not None:
        wanted = preprocessing.image_hw(image_size)
        if wanted != size:
            raise ValueError(f"image_size {wanted} differs from the model's input size {size}")
    num_outputs = int(model.outputs[0].shape[-1])
    # A headless ViT outputs features; a softmax over them would read as classes.
    headless = getattr(getattr(model, "config", None), "num_classes", None) == 0
    if headless:
        if class_names is not None:
            raise ValueError("the model has no head (num_classes=0), so no class names; it is served as "
                             f"{num_outputs} features")
    else:
        if class_names is None:
            class_names = [str(i) for i in range(num_outputs)]
        class_names = [str(n) for n in class_names]
        if len(class_names) != num_outputs:
            raise ValueError(f"{len(class_names)} class names for a model with {num_outputs} outputs")
    if activation not in ("softmax", "sigmoid"):
        raise ValueError(f"activation must be 'softmax' or 'sigmoid', got {activation!r}")
    if not headless and num_outputs == 1 and activation == "softmax":
        raise ValueError("a softmax over one output is always 1; a one-logit model needs "
                         "activation='sigmoid'")
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if max_pixels < size[0] * size[1]:
        raise ValueError(f"max_pixels {max_pixels:,} is below the model's own input ({size[0]}x{size[1]})")
    if tf.io.gfile.exists(directory) and tf.io.gfile.listdir(directory):
        raise FileExistsError(f"{directory} is not empty")

    if weights_in_compute_dtype:
        model = precision.compute_dtype_twin(model)
    graph = _ServingGraph(model, class_names, size, channels, min(top_k, num_outputs), activation, max_pixels)
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serving_default", graph.serving_default,
                         input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")])
    archive.add_endpoint("serving_examples", graph.serving_examples,
                         input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    archive.add_endpoint("predict_images", graph.predict_images,
                         input_signature=[tf.TensorSpec([None, *size, channels], tf.float32, name="images")])
    archive.write_out(directory, verbose=False)
    if warmup:
        write_warmup_requests(directory, model_name, size, channels)
    return directory


def _warmup_png(size, channels) -> bytes:
    h, w = size
    ramp = np.linspace(0, 255, h * w * 3, dtype=np.float32).reshape(h, w, 3).astype(np.uint8)
    return tf.io.encode_png(ramp if channels == 3 else ramp[..., :1]).numpy()


def write_warmup_requests(version_dir: str, model_name: str, size, channels) -> str:
    """Writes PredictionLog records TF Serving replays at load time, one per byte signature."""
    extras.require("tensorflow_serving", "serving")
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    png = _warmup_png(size, channels)
    example = tf.train.Example(features=tf.train.Features(feature={
        IMAGE_FEATURE: tf.train.Feature(bytes_list=tf.train.BytesList(value=[png]))})).SerializeToString()
    out_dir = storage.join(version_dir, "assets.extra")
    storage.makedirs(out_dir)
    out = storage.join(out_dir, "tf_serving_warmup_requests")
    with tf.io.TFRecordWriter(out) as writer:
        for signature, key, value in (("serving_default", "image_bytes", png),
                                      ("serving_examples", "examples", example)):
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=model_name, signature_name=signature))
            request.inputs[key].CopyFrom(tf.make_tensor_proto([value], dtype=tf.string))
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
    return out


def write_models_config(serving_root: str, base_path_prefix: Optional[str] = None) -> str:
    """Writes `serving_root/models.config` listing every model directory with versions.

    base paths are absolute, or `base_path_prefix/<name>` (e.g. "/models" for the
    directory mounted into the TF Serving container).
    """
    from google.protobuf import text_format

    extras.require("tensorflow_serving", "serving")
    from tensorflow_serving.config import model_server_config_pb2

    config = model_server_config_pb2.ModelServerConfig()
    for name in storage.listdir(serving_root):
        base = storage.join(serving_root, name)
        if re.fullmatch(r"[A-Za-z0-9_.\-]+", name) and storage.isdir(base) and any(
                d.isdigit() for d in storage.listdir(base)):
            entry = config.model_config_list.config.add()
            entry.name = name
            entry.base_path = (f"{base_path_prefix.rstrip('/')}/{name}" if base_path_prefix
                               else storage.absolute(base))
            entry.model_platform = "tensorflow"
    # Written last, and whole: a server reading it sees only versions already complete.
    out = storage.join(serving_root, "models.config")
    return storage.write_text(out, text_format.MessageToString(config))
