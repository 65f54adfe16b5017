"""Image preprocessing shared by training, evaluation and the exported serving graph.

One implementation, in TensorFlow ops, so the SavedModel computes exactly what
the input pipeline fed the model: decode, grayscale to RGB, resize, [-1, 1].
"""

from __future__ import annotations

import tensorflow as tf

# Leading bytes of the formats tf.io.decode_image reads.
_MAGIC = (b"\xff\xd8\xff", b"\x89PNG", b"GIF8", b"BM")

# The most pixels an image may declare before anything decodes it: a 200 MP phone photo
# (16320x12240) passes; a 20000x20000 PNG of zeros (0.4 MB, 1.2 GB decoded) does not.
DEFAULT_MAX_PIXELS = 200_000_000
_PAD = b"\0" * 32  # reads past the end of a short header give zeros, not an error


def image_hw(image_size):
    """An int or (height, width) -> (height, width)."""
    return (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)


def is_supported_image(image_bytes: tf.Tensor) -> tf.Tensor:
    """Whether a scalar string starts like a JPEG, PNG, GIF or BMP file."""
    return tf.reduce_any([tf.strings.substr(image_bytes, 0, len(m)) == m for m in _MAGIC])


def _bytes(data: tf.Tensor, pos, n: int) -> tf.Tensor:
    return tf.cast(tf.io.decode_raw(tf.strings.substr(data, pos, n), tf.uint8), tf.int64)


def _jpeg_size(data: tf.Tensor, length: tf.Tensor):
    # Walks the segments to the first start-of-frame marker (SOF0..SOF15 but DHT C4,
    # JPG C8 and DAC CC), which holds the height and width; stops at a byte that is
    # no marker, at the start of scan, or at the end.
    def more(pos, h, w, done):
        return tf.logical_and(tf.logical_not(done), pos + 9 <= length)

    def step(pos, h, w, done):
        b = _bytes(data, pos, 9)
        marker, bad = b[1], tf.not_equal(b[0], 0xFF)
        sof = (marker >= 0xC0) & (marker <= 0xCF) & (marker != 0xC4) & (marker != 0xC8) & (marker != 0xCC)
        alone = (marker == 0x01) | ((marker >= 0xD0) & (marker <= 0xD8))  # no length field
        skip = tf.where(marker == 0xFF, tf.constant(1, tf.int64),
                        tf.where(alone, tf.constant(2, tf.int64), 2 + b[2] * 256 + b[3]))
        found = sof & ~bad
        return (pos + skip, tf.where(found, b[5] * 256 + b[6], h), tf.where(found, b[7] * 256 + b[8], w),
                bad | sof | (marker == 0xD9) | (marker == 0xDA))

    none = tf.constant(-1, tf.int64)
    _, h, w, _ = tf.while_loop(more, step, (tf.constant(2, tf.int64), none, none, tf.constant(False)))
    return h, w


def encoded_size(image_bytes: tf.Tensor):
    """The (height, width) an encoded image declares in its header, read without
    decoding it: JPEG's start of frame, PNG's IHDR, GIF's logical screen, BMP's
    info header. int64 scalars; (-1, -1) where the header is missing or cut short."""
    data = image_bytes + _PAD
    length = tf.cast(tf.strings.length(image_bytes), tf.int64)
    head = _bytes(data, 0, 26)

    def number(start, n, big_endian):
        value = tf.constant(0, tf.int64)
        for k in (range(n) if big_endian else reversed(range(n))):
            value = value * 256 + head[start + k]
        return value

    def bmp():
        height = number(22, 4, False)
        return tf.where(height >= 2 ** 31, 2 ** 32 - height, height), number(18, 4, False)  # top-down: -h

    starts = lambda magic: tf.equal(tf.strings.substr(image_bytes, 0, len(magic)), magic)  # noqa: E731
    none = tf.constant(-1, tf.int64)
    return tf.case([(starts(b"\x89PNG") & (length >= 24), lambda: (number(20, 4, True), number(16, 4, True))),
                    (starts(b"GIF8") & (length >= 10), lambda: (number(8, 2, False), number(6, 2, False))),
                    (starts(b"BM") & (length >= 26), bmp),
                    (starts(b"\xff\xd8\xff"), lambda: _jpeg_size(data, length))],
                   default=lambda: (none, none))


def _jpeg_scale(height, width, min_size) -> tf.Tensor:
    # k for the coarsest DCT scale 1/2^k (k <= 3) that keeps the image at or above
    # min_size: a 12 MP photo for a 224 px model decodes at 1/8 (504x378), and nothing
    # is ever held at full resolution.
    k = tf.constant(0, tf.int32)
    for j in (1, 2, 3):
        r = 2 ** j
        fits = ((height + r - 1) // r >= min_size[0]) & ((width + r - 1) // r >= min_size[1])
        k = tf.where(fits, tf.constant(j, tf.int32), k)
    return k


def _decode_body(image_bytes: tf.Tensor, height, width, min_size) -> tf.Tensor:
    if min_size is None:
        return tf.io.decode_image(image_bytes, channels=0, expand_animations=False)
    scale = _jpeg_scale(height, width, image_hw(min_size))
    return tf.cond(
        tf.strings.substr(image_bytes, 0, 3) == b"\xff\xd8\xff",
        lambda: tf.switch_case(scale, [lambda r=r: tf.io.decode_jpeg(image_bytes, ratio=r)
                                       for r in (1, 2, 4, 8)]),
        lambda: tf.io.decode_image(image_bytes, channels=0, expand_animations=False))


def _to_channels(image: tf.Tensor, channels: int) -> tf.Tensor:
    depth = tf.shape(image)[-1]
    if channels == 3:
        image = tf.cond(depth == 1, lambda: tf.image.grayscale_to_rgb(image), lambda: image[..., :3])
    elif channels == 1:
        image = tf.cond(depth == 1, lambda: image, lambda: tf.image.rgb_to_grayscale(image[..., :3]))
    else:
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    return tf.ensure_shape(image, [None, None, channels])


def _said(label, *words) -> tf.Tensor:
    return tf.strings.join([label, *words])


def _header_checked(image_bytes, label, channels, max_pixels, min_size):
    # `(image, problem)` from the header checks, read before anything is decoded; the
    # decode of a body that passes them may still fail (truncated or corrupt).
    height, width = encoded_size(image_bytes)
    magic = is_supported_image(image_bytes)
    sized = (height > 0) & (width > 0)
    bounded = height * width <= max_pixels
    ok = magic & sized & bounded

    def decode():
        return tf.ensure_shape(_decode_body(image_bytes, height, width, min_size), [None, None, None])

    image = tf.cond(ok, decode, lambda: tf.zeros([0, 0, 1], tf.uint8))

    def why():  # built only for a bad image: string ops cost a good one time
        length = tf.strings.as_string(tf.strings.length(image_bytes))
        size = tf.strings.join([tf.strings.as_string(height), "x", tf.strings.as_string(width)])
        return tf.case([
            (~magic, lambda: _said(label, " (", length, " bytes) is not a JPEG, PNG, GIF or BMP image")),
            (~sized, lambda: _said(label, " (", length, " bytes) declares no image size in its header "
                                   "(cut short or corrupt)"))],
            default=lambda: _said(label, " is ", size, f", over the {max_pixels:,}-pixel limit"))

    return _to_channels(image, channels), tf.cond(ok, lambda: tf.constant(""), why)


def _undecodable(image_bytes, label) -> tf.Tensor:
    height, width = encoded_size(image_bytes)
    return _said(label, " (", tf.strings.as_string(tf.strings.length(image_bytes)), " bytes, ",
                 tf.strings.as_string(height), "x", tf.strings.as_string(width),
                 ") does not decode: its body is truncated or corrupt")


def try_decode_images(image_bytes: tf.Tensor, channels: int = 3, labels=None,
                      max_pixels: int = DEFAULT_MAX_PIXELS, min_size=None):
    """Decodes `[N]` encoded images, or says why each cannot: `(images, problems)`.

    `images` is a uint8 RaggedTensor `[N, (H), (W), channels]` (grayscale becomes RGB,
    an alpha channel is dropped, a GIF gives its first frame); `problems` is `[N]`
    strings, empty for a good image, else a sentence starting with its label
    (`labels`, `[N]` strings; default "image[i]"), and its image is then `[0, 0,
    channels]`. An image is bad when its bytes are no JPEG, PNG, GIF or BMP; when its
    header declares no size (cut short) or more than `max_pixels`, both read before
    anything is decoded; or when its body does not decode whole (truncated or
    corrupt): a bad image never yields invented pixels. BMP pixels carry no check, so
    a BMP is bad only when short.

    With `min_size` (height, width), a JPEG is decoded at the coarsest of libjpeg's
    1/2, 1/4 and 1/8 scales that keeps it at least that large.

    The pipeline's ingestion and de-duplication decode through this; serving and the
    training input take `try_decode_image`, the same checks and decode one at a time.
    """
    image_bytes = tf.convert_to_tensor(image_bytes, tf.string)
    n = tf.shape(image_bytes, out_type=tf.int64)[0]
    index = tf.range(n)
    if labels is None:
        labels = tf.strings.join(["image[", tf.strings.as_string(index), "]"])
    labels = tf.broadcast_to(tf.convert_to_tensor(labels, tf.string), [n])

    # TF's decoders fail a corrupt or truncated body with an op error ("jpeg::Uncompress
    # failed") that names no record and that no graph op can catch. A dataset with
    # ignore_errors can: a failed decode drops its element, and the missing index says
    # which. A last empty element keeps the batch non-empty and stands in for the lost.
    def one(data, label, i):
        return (i, *_header_checked(data, label, channels, max_pixels, min_size))

    kept = tf.data.Dataset.from_tensor_slices((image_bytes, labels, index)).map(one).ignore_errors()
    stand_in = tf.data.Dataset.from_tensors((n, tf.zeros([0, 0, channels], tf.uint8), tf.constant("")))
    found, images, problems = kept.concatenate(stand_in).ragged_batch(n + 1).get_single_element()
    k = tf.shape(found, out_type=tf.int64)[0] - 1
    row = tf.tensor_scatter_nd_update(tf.fill([n], k), found[:k, None], tf.range(k))
    lost = tf.where(tf.equal(row, k))[:, 0]
    lost_problems = tf.map_fn(lambda i: _undecodable(image_bytes[i], labels[i]), lost,
                              fn_output_signature=tf.string)
    problems = tf.tensor_scatter_nd_update(tf.gather(problems, row), lost[:, None], lost_problems)
    return tf.gather(images, row), problems


def try_decode_image(image_bytes: tf.Tensor, channels: int = 3, label="image",
                     max_pixels: int = DEFAULT_MAX_PIXELS, min_size=None):
    """One encoded image (scalar string) -> `(image, problem)`, as `try_decode_images`:
    `image` uint8 `[H, W, channels]`, `problem` a scalar string, empty when good. The
    same checks and decode, without the batch's bookkeeping: for `Dataset.map`."""
    image_bytes = tf.convert_to_tensor(image_bytes, tf.string)

    def one(data):
        image, problem = _header_checked(data, label, channels, max_pixels, min_size)
        return image, problem, True

    kept = tf.data.Dataset.from_tensors(image_bytes).map(one).ignore_errors()
    lost = tf.data.Dataset.from_tensors((tf.zeros([0, 0, channels], tf.uint8), tf.constant(""), False))
    image, problem, decoded = kept.concatenate(lost).take(1).get_single_element()
    problem = tf.cond(decoded, lambda: problem, lambda: _undecodable(image_bytes, label))
    return image, problem


def decode_image(image_bytes: tf.Tensor, channels: int = 3, label="image",
                 max_pixels: int = DEFAULT_MAX_PIXELS, min_size=None) -> tf.Tensor:
    """Decodes one encoded image to uint8 `[H, W, channels]`, as `try_decode_image`;
    a bad image raises InvalidArgumentError with its `problem`."""
    image, problem = try_decode_image(image_bytes, channels, label, max_pixels, min_size)
    with tf.control_dependencies([tf.debugging.Assert(tf.equal(problem, ""), [problem])]):
        return tf.identity(image)


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


def decode_for_eval(image_bytes: tf.Tensor, image_size, channels: int = 3, label="image",
                    max_pixels: int = DEFAULT_MAX_PIXELS) -> tf.Tensor:
    """Encoded bytes (scalar) -> `[h, w, channels]` float32 in [-1, 1]; a large JPEG is
    decoded at a reduced scale first (see `decode_image`). Serving and the evaluation
    input both take this function, so they compute the same."""
    image = decode_image(image_bytes, channels, label, max_pixels=max_pixels, min_size=image_size)
    return eval_image(image, image_size)


def decode_batch_for_eval(image_bytes: tf.Tensor, image_size, channels: int = 3,
                          input_name: str = "image_bytes", max_pixels: int = DEFAULT_MAX_PIXELS) -> tf.Tensor:
    """`[N]` encoded images -> `[N, h, w, channels]` float32; a bad one is named by its index."""
    size = image_hw(image_size)

    def one(args):
        data, index = args
        label = tf.strings.join([f"{input_name}[", tf.strings.as_string(index), "]"])
        return decode_for_eval(data, size, channels, label, max_pixels)

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
