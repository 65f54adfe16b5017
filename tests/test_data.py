"""keras_vit.data: the offline Fashion-MNIST builder, named TFDS datasets, image folders."""

import fcntl
import os
import re
import subprocess
import sys
import textwrap
import threading
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from conftest import make_image_folder, write_bad_images, write_idx
from PIL import Image

from keras_vit import data, fashion_mnist, preprocessing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_idx_reader_round_trips_and_rejects_bad_files(tmp_path):
    array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    write_idx(str(tmp_path / "a.gz"), array)
    np.testing.assert_array_equal(fashion_mnist.read_idx(str(tmp_path / "a.gz")), array)
    (tmp_path / "bad").write_bytes(b"\x00\x00\x0d\x01" + b"\x00" * 8)
    with pytest.raises(ValueError, match="not an unsigned-byte IDX"):
        fashion_mnist.read_idx(str(tmp_path / "bad"))


@pytest.mark.skipif(not os.path.exists(fashion_mnist.DEFAULT_DIR),
                    reason="dataset-fashion-mnist not installed")
def test_the_real_debian_fashion_mnist():
    images, labels = fashion_mnist.load_arrays("test", fashion_mnist.DEFAULT_DIR)
    assert images.shape == (10000, 28, 28) and images.dtype == np.uint8
    assert np.bincount(labels).tolist() == [1000] * 10
    train_images, _ = fashion_mnist.load_arrays("train", fashion_mnist.DEFAULT_DIR)
    assert train_images.shape == (60000, 28, 28)


def test_missing_files_say_how_to_get_them(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_VIT_FASHION_MNIST_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        fashion_mnist.load_arrays("train")


def test_local_builder_prepares_offline_and_batches(fake_fmnist):
    source = data.open_source("fashion_mnist_local", data_dir=fake_fmnist)
    assert source.splits == {"train": 96, "test": 48}
    assert source.num_classes == 10 and source.class_names[0] == "t-shirt/top"
    ds = data.make_dataset(source, "train", image_size=32, batch_size=16, training=True, deterministic=True)
    images, labels = next(iter(ds))
    assert images.shape == (16, 32, 32, 3) and images.dtype == tf.float32 and labels.dtype == tf.int32
    assert -1.0 <= float(tf.reduce_min(images)) and float(tf.reduce_max(images)) <= 1.0
    # Grayscale becomes three equal channels.
    np.testing.assert_array_equal(images[..., 0], images[..., 2])
    again, _ = next(iter(data.make_dataset(source, "train", image_size=32, batch_size=16, training=True,
                                           deterministic=True)))
    np.testing.assert_array_equal(images, again)
    other, _ = next(iter(data.make_dataset(source, "train", image_size=32, batch_size=16, training=True,
                                           deterministic=True, seed=1)))
    assert not np.array_equal(images, other)


def test_prepare_waits_while_another_process_prepares_the_same_dataset(fake_fmnist):
    builder = tfds.builder("fashion_mnist_local", data_dir=fake_fmnist)
    lock_path = builder.data_dir.rstrip("/") + ".lock"
    os.makedirs(os.path.dirname(lock_path), exist_ok=True)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (data.prepare(builder), done.set()))
    with open(lock_path, "a") as held:  # a second open file: flock treats it as another process
        fcntl.flock(held, fcntl.LOCK_EX)
        worker.start()
        assert not done.wait(2.0), "prepared while another holder had the lock"
        assert not builder.is_prepared()
        fcntl.flock(held, fcntl.LOCK_UN)
    worker.join(120)
    assert done.is_set() and builder.is_prepared()
    assert builder.info.splits["train"].num_examples == 96


def test_eval_is_one_ordered_pass_with_the_serving_preprocessing(fake_fmnist):
    source = data.open_source("fashion_mnist_local", data_dir=fake_fmnist)
    batches = list(data.make_dataset(source, "test", image_size=28, batch_size=20, training=False))
    assert [int(b[1].shape[0]) for b in batches] == [20, 20, 8]
    raw = next(iter(source.raw("test")))
    expected = preprocessing.decode_for_eval(raw["image"], 28)
    np.testing.assert_array_equal(batches[0][0][0], expected)
    assert int(batches[0][1][0]) == int(raw["label"])
    one = next(iter(data.make_dataset(source, "test", image_size=28, batch_size=4, training=False,
                                      channels=1)))
    assert one[0].shape == (4, 28, 28, 1)


def test_train_augmentation_is_an_inception_crop_and_flip():
    image = tf.constant(np.tile(np.arange(64, dtype=np.uint8)[None, :, None], (64, 1, 3)))
    a = preprocessing.train_image(image, 32, tf.constant([1, 2]))
    np.testing.assert_array_equal(a, preprocessing.train_image(image, 32, tf.constant([1, 2])))
    outs = [preprocessing.train_image(image, 32, tf.constant([1, s])).numpy() for s in range(20)]
    assert len({o.tobytes() for o in outs}) == 20
    # Columns rise left to right unless flipped; both happen.
    slopes = {np.sign(o[0, -1, 0] - o[0, 0, 0]) for o in outs}
    assert slopes == {-1.0, 1.0}
    full = preprocessing.train_image(image, 64, tf.constant([0, 0]), area_range=(1.0, 1.0)).numpy()
    np.testing.assert_allclose(np.sort(np.unique(np.abs(full[0, :, 0]))),
                               np.sort(np.unique(np.abs(np.arange(64) / 127.5 - 1))), atol=1e-5)


@pytest.mark.parametrize("name", ["cifar10", "cifar100", "oxford_iiit_pet", "oxford_flowers102"])
def test_named_downstream_datasets_run_offline_with_mock_data(name):
    with tfds.testing.mock_data(num_examples=12):
        source = data.open_source(name)
        images, labels = next(iter(data.make_dataset(source, "train", image_size=32, batch_size=4,
                                                     training=True)))
        assert images.shape == (4, 32, 32, 3)
        assert int(tf.reduce_max(labels)) < source.num_classes
        evals = list(data.make_dataset(source, "test", image_size=48, batch_size=5, training=False))
        assert sum(int(b[1].shape[0]) for b in evals) == 12


def test_unknown_dataset_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown TFDS dataset 'no_such_dataset_xyz'"):
        data.open_source("no_such_dataset_xyz")


def test_image_folder(tmp_path):
    source = data.open_source(image_dir=make_image_folder(tmp_path))
    assert source.class_names == ["cat", "dog"] and source.splits == {"train": 12, "test": 6}
    images, labels = next(iter(data.make_dataset(source, "train", image_size=16, batch_size=12,
                                                 training=True)))
    assert images.shape == (12, 16, 16, 3) and set(labels.numpy()) == {0, 1}


def test_an_image_folder_reads_every_format_serving_reads_in_a_fixed_mixed_order(tmp_path):
    rng = np.random.RandomState(1)
    written = {}
    for i in range(24):
        label, fmt = ("cat", "dog", "eel")[i % 3], ("PNG", "JPEG", "GIF", "BMP")[i % 4]
        path = tmp_path / "train" / label / f"{i:02d}.{fmt.lower().replace('jpeg', 'jpg')}"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.randint(0, 255, (12, 10, 3), dtype=np.uint8)).save(path, fmt)
        written[os.path.relpath(path, tmp_path)] = label
    (tmp_path / "train" / "cat" / "notes.txt").write_text("not an image")
    source = data.open_source(image_dir=str(tmp_path))
    assert source.class_names == ["cat", "dog", "eel"] and source.splits == {"train": 24}
    records = [(ex["image/filename"].numpy().decode(), int(ex["label"])) for ex in source.raw("train")]
    # .gif and .bmp included (tfds's ImageFolder skipped them), each under its class.
    assert {r: source.class_names[c] for r, c in records} == written
    labels = [c for _, c in records]
    assert labels != sorted(labels)  # not class after class: a small shuffle buffer still mixes them
    assert data.labels(source, "train").tolist() == labels  # from the listing, not a read of every file
    assert records == [(ex["image/filename"].numpy().decode(), int(ex["label"]))
                       for ex in data.open_source(image_dir=str(tmp_path)).raw("train")]
    shuffled = [ex["image/filename"].numpy().decode()
                for ex in source.raw("train", shuffle_files=True, seed=3)]
    assert sorted(shuffled) == sorted(written) and shuffled != [r for r, _ in records]
    images, batch_labels = next(iter(data.make_dataset(source, "train", image_size=8, batch_size=24,
                                                       training=False)))
    assert images.shape == (24, 8, 8, 3) and batch_labels.numpy().tolist() == labels
    with pytest.raises(ValueError, match=r"has no split 'train\[:50%\]' \(it has \['train'\]; an image"):
        source.num_examples("train[:50%]")


def test_an_image_folder_split_without_some_classes_is_warned_of(tmp_path, caplog):
    root = make_image_folder(tmp_path)
    os.makedirs(os.path.join(root, "test", "fox"))
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(os.path.join(root, "test", "fox", "0.png"))
    source = data.open_source(image_dir=root)
    assert source.class_names == ["cat", "dog", "fox"]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [f"image_dir {root}: train/ has no images of 1 of the 3 classes, so a model "
                        "trained on it never learns them: fox"]
    assert data.warn_missing_classes("x", ["a", "b"], {"train": {"a", "b"}}) == {}


def test_each_kind_of_bad_image_is_named_or_skipped_and_counted(tmp_path, capfd):
    root = make_image_folder(tmp_path)
    bad = write_bad_images(tmp_path / "train" / "dog")
    source = data.open_source(image_dir=root)
    for training in (False, True):
        ds = data.make_dataset(source, "train", image_size=16, batch_size=4, training=training)
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"image_folder:\S+ train record train/dog/(" + "|".join(bad) + ")"):
            for _ in ds.take(20):
                pass
    capfd.readouterr()
    stats = data.DataStats()
    ds = data.make_dataset(source, "train", image_size=16, batch_size=5, training=False,
                           skip_bad_records=True, stats=stats)
    assert sum(int(b[1].shape[0]) for b in ds) == 12
    assert stats.skipped_count == len(bad) == 4
    printed = capfd.readouterr().err
    for name, message in bad.items():
        line = rf"skipping a bad record: \S+ train record train/dog/{name}\b.*{message}"
        assert re.search(line, printed), name
    assert [m.split(" train record train/dog/")[1].split(" ")[0] for m in stats.skipped] == sorted(bad)
    # Training reads the split again and again; each bad record counts once.
    stats = data.DataStats()
    ds = data.make_dataset(source, "train", image_size=16, batch_size=4, training=True,
                           skip_bad_records=True, stats=stats)
    list(ds.take(9))  # 36 good images: three passes over the 12
    assert stats.skipped_count == 4


def test_command_line_logging_prints_tensorflow_records_once_and_hides_info():
    # What each keras_vit command runs first; TensorFlow loads before absl's handler exists.
    script = textwrap.dedent("""
        import tensorflow as tf
        from absl import app

        def main(argv):
            from keras_vit.data import quiet_info_logs
            quiet_info_logs()
            tf.get_logger().warning("a tensorflow warning")
            tf.get_logger().info("a tensorflow info")

        app.run(main)
    """)
    env = dict(os.environ, PYTHONPATH=ROOT)
    quiet = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert quiet.stderr.count("a tensorflow warning") == 1 and "a tensorflow info" not in quiet.stderr
    verbose = subprocess.run([sys.executable, "-c", script, "--verbosity=0"], env=env, capture_output=True,
                             text=True)
    assert verbose.stderr.count("a tensorflow warning") == 1
    assert verbose.stderr.count("a tensorflow info") == 1


def write_examples(path, n):
    """Records as the pipeline writes them (image, label, label_name, source_id), labels
    alternating a, b. Built here, not with pipeline.ingest, so the model package's tests
    need no Beam."""
    def feature(value):
        if isinstance(value, int):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    with tf.io.TFRecordWriter(path, options="GZIP") as w:
        for i in range(n):
            png = tf.io.encode_png(np.full([8, 8, 3], i * 20, np.uint8)).numpy()
            fields = {"image": png, "label": i % 2, "label_name": "ab"[i % 2].encode(),
                      "source_id": f"r{i}".encode()}
            w.write(tf.train.Example(features=tf.train.Features(
                feature={k: feature(v) for k, v in fields.items()})).SerializeToString())
    return path


def test_tfrecord_eval_passes_end_without_keras_out_of_data_warning(tmp_path):
    # A TFRecord read has no known length; Keras then ends each evaluate and predict
    # with "Your input ran out of data; interrupting training", which reads as a bug.
    path = write_examples(str(tmp_path / "eval.tfrecord.gz"), 10)
    source = data.TFRecordSource("records", {"eval": [path]}, ["a", "b"])
    ds = data.make_dataset(source, "eval", image_size=8, batch_size=4, training=False)
    assert int(ds.cardinality()) == 3
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(2)])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.evaluate(ds, verbose=0)
        assert model.predict(ds, verbose=0).shape == (10, 2)
    assert not [w for w in caught if "ran out of data" in str(w.message)]
    # The length is asserted, not assumed: a wrong count fails the pass.
    wrong = data.TFRecordSource("records", {"eval": [path]}, ["a", "b"], counts={"eval": 11})
    with pytest.raises(tf.errors.FailedPreconditionError, match="expected to contain 11 elements"):
        list(data.make_dataset(wrong, "eval", image_size=8, batch_size=4, training=False))


class _BadLabelSource(data.Source):
    def raw(self, split, shuffle_files=False, seed=None):
        png = tf.io.encode_png(tf.zeros([4, 4, 3], tf.uint8))
        return tf.data.Dataset.from_tensor_slices(
            {"image": [png, png], "label": tf.constant([1, 7], tf.int64), "tfds_id": ["a", "b"]})


def test_out_of_range_label_is_named_or_skipped(tmp_path):
    folder = tfds.folder_dataset.ImageFolder(make_image_folder(tmp_path))  # two classes
    source = _BadLabelSource("fake", folder, "image", "label", "tfds_id")
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"fake train record b: label 7 is outside \[0, 2\)"):
        list(data.make_dataset(source, "train", image_size=4, batch_size=2, training=False))
    stats = data.DataStats()
    ds = data.make_dataset(source, "train", image_size=4, batch_size=2, training=False, skip_bad_records=True,
                           stats=stats)
    assert sum(int(b[1].shape[0]) for b in ds) == 1 and stats.skipped_count == 1
