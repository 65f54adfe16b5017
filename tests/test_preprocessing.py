"""keras_vit.preprocessing: the one decoder of serving and the input pipeline, its bound
on the pixels an image declares, and JPEG decoding at a reduced scale."""

import io
import struct

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from keras_vit import preprocessing


def encode(array, fmt, **kwargs):
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def photo(h, w, seed=0):
    """Smooth colour gradients with a little noise: compresses like a photo, not like noise."""
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([128 + 100 * np.sin(x / (w / 5)), 128 + 100 * np.cos(y / (h / 4)),
                    (x + y) * 255.0 / (h + w)], -1)
    rgb += np.random.RandomState(seed).normal(0, 4, rgb.shape)
    return np.clip(rgb, 0, 255).astype(np.uint8)


def size_of(data):
    return tuple(int(v) for v in preprocessing.encoded_size(tf.constant(data)))


def with_declared_size(data, h, w):
    """The same file with its header's height and width replaced (nothing else)."""
    data = bytearray(data)
    if data[:4] == b"\x89PNG":
        data[16:24] = struct.pack(">II", w, h)
    elif data[:4] == b"GIF8":
        data[6:10] = struct.pack("<HH", w, h)
    elif data[:2] == b"BM":
        data[18:26] = struct.pack("<ii", w, h)
    else:
        sof = next(i for i in range(2, len(data) - 1) if data[i] == 0xFF and data[i + 1] in (0xC0, 0xC2))
        data[sof + 5:sof + 9] = struct.pack(">HH", h, w)
    return bytes(data)


@pytest.mark.parametrize("fmt, kwargs", [("JPEG", {}), ("JPEG", {"progressive": True}), ("PNG", {}),
                                         ("GIF", {}), ("BMP", {})])
def test_the_header_gives_the_size_without_decoding(fmt, kwargs):
    for h, w in [(300, 400), (17, 5), (1000, 3)]:
        data = encode(photo(h, w), fmt, **kwargs)
        assert size_of(data) == (h, w)
        assert size_of(data[:9]) == (-1, -1)  # cut before the size
    grey = encode(photo(40, 30)[..., 0], fmt)
    assert size_of(grey) == (40, 30)
    top_down = bytearray(encode(photo(6, 9), "BMP"))
    top_down[22:26] = struct.pack("<i", -6)
    assert size_of(bytes(top_down)) == (6, 9)
    assert size_of(b"no image at all") == (-1, -1)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "GIF", "BMP"])
def test_an_image_over_the_limit_is_refused_by_name_before_decoding(fmt):
    bomb = with_declared_size(encode(photo(30, 40), fmt), 20000, 20000)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"image_bytes\[3\] is 20000x20000, over the 200,000,000-pixel limit"):
        preprocessing.decode_image(tf.constant(bomb), label="image_bytes[3]")
    small = encode(photo(300, 400), fmt)
    with pytest.raises(tf.errors.InvalidArgumentError, match="is 300x400, over the 100,000-pixel limit"):
        preprocessing.decode_image(tf.constant(small), max_pixels=100_000)
    assert preprocessing.decode_image(tf.constant(small), max_pixels=120_000).shape == (300, 400, 3)


def test_truncated_and_lying_files_are_errors_never_invented_pixels():
    jpeg = encode(photo(300, 400), "JPEG")
    cases = {
        "cut before its size": jpeg[:20],
        "cut to a third": jpeg[:len(jpeg) // 3],
        "a body of random bytes": jpeg[:600] + np.random.RandomState(0).bytes(len(jpeg) - 600),
        "a PNG whose header lies": with_declared_size(encode(photo(300, 400), "PNG"), 30, 40),
        "a PNG cut to a third": encode(photo(300, 400), "PNG")[:20000],
    }
    for what, data in cases.items():
        with pytest.raises(tf.errors.InvalidArgumentError) as e:
            preprocessing.decode_image(tf.constant(data), label=what)
        if what == "cut before its size":
            assert "cut before its size (20 bytes) declares no image size in its header" in str(e.value)
        elif what != "a PNG whose header lies":
            assert f"{what} ({len(data)} bytes, 300x400) does not decode: its body is truncated or corrupt" \
                in str(e.value)
        image, problem = preprocessing.try_decode_image(tf.constant(data), label=what)
        assert problem.numpy().decode().startswith(what) and image.shape == (0, 0, 3)
    image, problem = preprocessing.try_decode_image(tf.constant(jpeg))
    assert problem.numpy() == b"" and image.shape == (300, 400, 3)


def test_a_large_jpeg_is_decoded_at_the_coarsest_scale_that_keeps_the_input_size():
    data = encode(photo(2000, 1500), "JPEG", quality=90)
    decode = lambda size: preprocessing.decode_image(tf.constant(data), min_size=size).shape  # noqa: E731
    assert decode((224, 224)) == (500, 375, 3)  # 1/4: at 1/8 the width (188) would be below 224
    assert decode((180, 180)) == (250, 188, 3)
    assert decode((1600, 1600)) == (2000, 1500, 3)
    assert decode(None) == (2000, 1500, 3)
    full = preprocessing.eval_image(preprocessing.decode_image(tf.constant(data)), 224)
    scaled = preprocessing.decode_for_eval(tf.constant(data), 224)
    assert scaled.shape == full.shape == (224, 224, 3)
    assert float(tf.reduce_mean(tf.abs(scaled - full))) < 0.02  # the same picture, on [-1, 1]
