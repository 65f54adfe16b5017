"""Image preprocessing shared by training, evaluation and the exported serving graph.

One implementation, in TensorFlow ops, so the SavedModel computes exactly what
the input pipeline fed the model: decode, grayscale to RGB, resize, [-1, 1].
"""

from __future__ import annotations

import tensorflow as tf

# Leading bytes of the formats tf.io.decode_image reads.
_MAGIC = (b"\xff\xd8\xff", b"\x89PNG", b"GIF8", b"BM")


def image_hw(image_size):
    """An int or (height, width) -> (height, width)."""
    return (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)


def is_supported_image(image_bytes: tf.Tensor) -> tf.Tensor:
    """Whether a scalar string starts like a JPEG, PNG, GIF or BMP file."""
    return tf.reduce_any([tf.strings.substr(image_bytes, 0, len(m)) == m for m in _MAGIC])


def decode_image(image_bytes: tf.Tensor, channels: int = 3, label="image") -> tf.Tensor:
    """Decodes one encoded image to uint8 `[H, W, channels]`.

    Grayscale becomes RGB and an alpha channel is dropped. The first frame of a
    GIF is used. Bytes that are no image raise InvalidArgumentError whose message
    starts with `label` (a string or scalar string tensor, e.g. "image_bytes[3]").
    """
    message = tf.strings.join([label, " (", tf.strings.as_string(tf.strings.length(image_bytes)),
                               " bytes) is not a JPEG, PNG, GIF or BMP image"])
    check = tf.debugging.Assert(is_supported_image(image_bytes), [message])
    with tf.control_dependencies([check]):
        image = tf.io.decode_image(image_bytes, channels=0, expand_animations=False)
    image = tf.ensure_shape(image, [None, None, None])
    depth = tf.shape(image)[-1]
    if channels == 3:
        image = tf.cond(depth == 1, lambda: tf.image.grayscale_to_rgb(image), lambda: image[..., :3])
    elif channels == 1:
        image = tf.cond(depth == 1, lambda: image, lambda: tf.image.rgb_to_grayscale(image[..., :3]))
    else:
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    return tf.ensure_shape(image, [None, None, channels])


def to_model_range(image: tf.Tensor) -> tf.Tensor:
    """uint8 or float pixels in [0, 255] -> float32 in [-1, 1], as the official code."""
    return tf.cast(image, tf.float32) / 127.5 - 1.0


def eval_image(image: tf.Tensor, image_size) -> tf.Tensor:
    """Evaluation preprocessing of one decoded image: bilinear resize to `image_size`, [-1, 1].

    `[H, W, C]` uint8 -> `[h, w, C]` float32.
    """
    size = image_hw(image_size)
    image = tf.image.resize(tf.cast(image, tf.float32), size, method="bilinear")
    return to_model_range(image)


def decode_for_eval(image_bytes: tf.Tensor, image_size, channels: int = 3, label="image") -> tf.Tensor:
    """Encoded bytes (scalar) -> `[h, w, channels]` float32 in [-1, 1]."""
    return eval_image(decode_image(image_bytes, channels, label), image_size)


def decode_batch_for_eval(image_bytes: tf.Tensor, image_size, channels: int = 3,
                          input_name: str = "image_bytes") -> tf.Tensor:
    """`[N]` encoded images -> `[N, h, w, channels]` float32; a bad one is named by its index."""
    size = image_hw(image_size)

    def one(args):
        data, index = args
        label = tf.strings.join([f"{input_name}[", tf.strings.as_string(index), "]"])
        return decode_for_eval(data, size, channels, label)

    n = tf.shape(image_bytes)[0]
    return tf.map_fn(one, (image_bytes, tf.range(n)),
                     fn_output_signature=tf.TensorSpec([*size, channels], tf.float32))


def train_image(image: tf.Tensor, image_size, seed: tf.Tensor, area_range=(0.05, 1.0)) -> tf.Tensor:
    """Training augmentation of one decoded image, as the official input pipeline.

    An Inception crop (a random box of `area_range` of the image, aspect ratio 3/4
    to 4/3), a bilinear resize to `image_size`, a random left-right flip, then
    [-1, 1]. Stateless: the same `seed` (int32 [2]) gives the same result.
    `[H, W, C]` uint8 -> `[h, w, C]` float32.
    """
    size = image_hw(image_size)
    seed = tf.cast(seed, tf.int32)
    begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image), bounding_boxes=tf.zeros([1, 0, 4]), seed=seed, min_object_covered=0.0,
        aspect_ratio_range=(3 / 4, 4 / 3), area_range=area_range, max_attempts=10,
        use_image_if_no_bounding_boxes=True)
    image = tf.slice(image, begin, crop_size)
    image = tf.image.resize(tf.cast(image, tf.float32), size, method="bilinear")
    flip = tf.random.stateless_uniform([], seed=seed + tf.constant([0, 1])) < 0.5
    image = tf.cond(flip, lambda: tf.reverse(image, axis=[1]), lambda: image)
    return to_model_range(image)
