"""Copies of evaluation images planted among real Fashion-MNIST images, for dedup tests."""

import io
import os

import numpy as np
from PIL import Image

KINDS = ("exact", "resize_2x", "jpeg_75", "brightness_10", "crop_1px")


def png(a):
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return buf.getvalue()


def plant(a, kind):
    """Encoded bytes of a copy of uint8 image `a`, altered as `kind` says."""
    if kind == "exact":
        return png(a)
    if kind == "resize_2x":
        return png(np.asarray(Image.fromarray(a).resize((a.shape[1] * 2, a.shape[0] * 2), Image.BILINEAR)))
    if kind == "jpeg_75":
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, "JPEG", quality=75)
        return buf.getvalue()
    if kind == "brightness_10":
        return png(np.clip(a.astype(np.float32) * 1.1, 0, 255).astype(np.uint8))
    if kind == "crop_1px":
        return png(a[1:-1, 1:-1])
    raise ValueError(kind)


def write_image_folder(root, train_x, train_y, test_x, test_y, class_names, *, num_train=300, num_eval=50,
                       num_test=100, planted_per_kind=4, seed=0):
    """A train/validation/test folder tree of PNGs; training also holds planted copies.

    Returns {planted file's path relative to root: (kind, reference split, reference path)}.
    Copies are of test images (and one per kind of a validation image).
    """
    rng = np.random.RandomState(seed)
    names = [n.replace("/", "-") for n in class_names]
    ti = rng.choice(len(train_x), num_train + num_eval, replace=False)
    ei = rng.choice(len(test_x), num_test, replace=False)

    def save(split, label, name, data):
        d = os.path.join(root, split, names[label])
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
        return os.path.join(split, names[label], name)

    for i in ti[:num_train]:
        save("train", train_y[i], f"tr{i}.png", png(train_x[i]))
    val_paths = [(save("validation", train_y[i], f"va{i}.png", png(train_x[i])), i) for i in ti[num_train:]]
    test_paths = [(save("test", test_y[i], f"te{i}.png", png(test_x[i])), i) for i in ei]
    planted = {}
    for k, kind in enumerate(KINDS):
        for ref, i in test_paths[k * planted_per_kind:(k + 1) * planted_per_kind]:
            ext = "jpg" if kind == "jpeg_75" else "png"
            path = save("train", test_y[i], f"dup_{kind}_te{i}.{ext}", plant(test_x[i], kind))
            planted[path] = (kind, "test", ref)
        ref, i = val_paths[k]
        ext = "jpg" if kind == "jpeg_75" else "png"
        path = save("train", train_y[i], f"dup_{kind}_va{i}.{ext}", plant(train_x[i], kind))
        planted[path] = (kind, "eval", ref)
    return planted


def example_record(image, label):
    """A serialized tf.Example with `label` and, unless None, `image` (encoded bytes)."""
    import tensorflow as tf

    feature = {"label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}
    if image is not None:
        feature["image"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[image]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
