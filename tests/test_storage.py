"""Paths on object storage, through TensorFlow's in-memory filesystem (ram://), which
like a bucket is reached only through tf.io.gfile."""

import importlib
import os
import uuid

import numpy as np
import pytest
import tensorflow as tf
from conftest import randomise, tiny

from keras_vit import storage
from keras_vit.export import export_saved_model


@pytest.fixture
def bucket(tmp_path, monkeypatch):
    """A fresh ram:// "bucket"; the working directory is an empty local folder, so that
    anything written locally by mistake is seen.

    TF's ram:// appends to a file written again (opened for writing, or copied over),
    where a bucket's put (and a local write) replaces it: here it is replaced, as in a
    bucket."""
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    gfile, copy = tf.io.gfile.GFile, tf.io.gfile.copy

    def replace(name):
        if str(name).startswith("ram://") and tf.io.gfile.exists(name):
            tf.io.gfile.remove(name)

    def put(name, mode="r"):
        if "w" in mode:
            replace(name)
        return gfile(name, mode)

    def copy_over(src, dst, overwrite=False):
        if overwrite:
            replace(dst)
        return copy(src, dst, overwrite)

    for module in (tf.io.gfile, importlib.import_module("tensorflow.io.gfile")):  # ours, Keras's
        monkeypatch.setattr(module, "GFile", put)
        monkeypatch.setattr(module, "copy", copy_over)
    return f"ram://bucket-{uuid.uuid4().hex[:8]}"


def _local_files(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def test_a_model_exported_to_a_bucket_is_in_the_bucket_and_serves(bucket, tmp_path):
    model = randomise(tiny())
    out = export_saved_model(model, f"{bucket}/models/vit", class_names=list("abcde"))
    assert out == f"{bucket}/models/vit/1"
    assert storage.listdir(f"{bucket}/models") == ["batching_parameters.txt", "models.config", "vit"]
    assert "max_batch_size { value: " in storage.read_text(f"{bucket}/models/batching_parameters.txt")
    assert storage.listdir(f"{bucket}/models/vit") == ["1"], "a staging directory was left behind"
    assert "saved_model.pb" in storage.listdir(out)
    assert f'base_path: "{bucket}/models/vit"' in storage.read_text(f"{bucket}/models/models.config")
    assert _local_files(tmp_path / "cwd") == [], "something was written to local disk"

    served = tf.saved_model.load(out).signatures["predict_images"]
    x = np.random.RandomState(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(served(images=tf.constant(x))["probabilities"],
                               tf.nn.softmax(model.predict(x, verbose=0)), atol=1e-5)
    assert export_saved_model(model, f"{bucket}/models/vit", warmup=False).endswith("/vit/2")
    with pytest.raises(FileExistsError, match="immutable"):
        export_saved_model(model, f"{bucket}/models/vit", version=2, warmup=False)


def test_a_failed_write_publishes_nothing(bucket):
    base = f"{bucket}/models/vit"
    storage.makedirs(base)

    def half_written(staging):
        storage.write_text(storage.join(staging, "variables", "part"), "x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        storage.publish(f"{base}/1", half_written)
    assert storage.listdir(base) == []


def test_a_failed_copy_into_a_bucket_removes_the_partial_version(bucket, monkeypatch):
    """Object stores have no rename: the version is copied into place, and a copy that
    fails part-way (a permission error, say) is removed, leaving the earlier versions."""
    base = f"{bucket}/models/vit"
    storage.makedirs(f"{base}/1")

    def write(staging):
        for name in ("saved_model.pb", "variables/variables.index", "variables/variables.data-0-of-1"):
            storage.write_text(storage.join(staging, *name.split("/")), name)

    real_copy, copied = tf.io.gfile.copy, []

    def copy(src, dst, overwrite=False):
        if len(copied) == 2:
            raise tf.errors.PermissionDeniedError(None, None, "access denied")
        copied.append(dst)
        real_copy(src, dst, overwrite)

    monkeypatch.setattr(tf.io.gfile, "copy", copy)
    with pytest.raises(tf.errors.PermissionDeniedError):
        storage.publish(f"{base}/2", write)
    assert storage.listdir(base) == ["1"]
    assert [os.path.basename(c) for c in copied] == ["variables.data-0-of-1", "variables.index"]

    copied.clear()
    monkeypatch.setattr(tf.io.gfile, "copy",
                        lambda s, d, overwrite=False: (copied.append(d), real_copy(s, d)))
    storage.publish(f"{base}/2", write)
    assert os.path.basename(copied[-1]) == "saved_model.pb", "the graph must arrive last"
    assert storage.listdir(base) == ["1", "2"]
    assert storage.listdir(f"{base}/2/variables") == ["variables.data-0-of-1", "variables.index"]


def test_a_local_publish_renames_the_finished_directory(tmp_path):
    def write(staging):
        assert os.path.basename(staging).startswith(".1-staging-")  # TF Serving ignores it
        storage.write_text(os.path.join(staging, "saved_model.pb"), "graph")

    assert storage.publish(str(tmp_path / "1"), write) == str(tmp_path / "1")
    assert _local_files(tmp_path) == ["1/saved_model.pb"]


def test_write_text_replaces_a_file_whole(tmp_path, bucket):
    for path in (str(tmp_path / "sub" / "models.config"), f"{bucket}/sub/models.config"):
        storage.write_text(path, "old")
        storage.write_text(path, "new")
        assert storage.read_text(path) == "new"
        assert storage.listdir(storage.parent(path)) == ["models.config"]


def test_paths_split_alike_on_disk_and_in_buckets(tmp_path):
    assert storage.parent("gs://b/models/vit/") == "gs://b/models"
    assert storage.basename("gs://b/models/vit/") == "vit"
    assert storage.join("s3://b/models", "vit", "1") == "s3://b/models/vit/1"
    assert storage.absolute("s3://b/x") == "s3://b/x"
    assert storage.parent("vit") == os.path.dirname(os.path.abspath("vit"))


def test_an_unknown_scheme_is_named_before_any_work(bucket):
    with pytest.raises(storage.StorageError, match=r"no filesystem for nosuch://"):
        storage.check("nosuch://bucket/models")
    with pytest.raises(storage.StorageError, match=r"no filesystem for nosuch://"):
        export_saved_model(tiny(), "nosuch://bucket/models/vit")


def test_an_image_folder_in_a_bucket_reads_as_on_disk(bucket, tmp_path):
    from conftest import make_image_folder

    from keras_vit import data
    from pipeline import ingest

    local = make_image_folder(tmp_path / "local")
    storage.copy_tree(local, f"{bucket}/images")
    on_disk, in_bucket = data.open_source(image_dir=local), data.open_source(image_dir=f"{bucket}/images")
    assert (in_bucket.class_names, in_bucket.splits) == (on_disk.class_names, on_disk.splits)
    batches = [next(iter(data.make_dataset(s, "test", image_size=16, batch_size=6, training=False)))
               for s in (on_disk, in_bucket)]
    np.testing.assert_array_equal(batches[0][0], batches[1][0])
    np.testing.assert_array_equal(batches[0][1], batches[1][1])

    splits, class_names, files = ingest.image_folder_layout(f"{bucket}/images")
    assert class_names == ["cat", "dog"] and len(files["train"]) == 12
    example = ingest._read_image_file(files["train"][0], f"{bucket}/images", {"cat": 0, "dog": 1})
    features = example.features.feature
    assert features[ingest.SOURCE_ID].bytes_list.value == [b"train/cat/0.jpg"]
    assert features[ingest.IMAGE].bytes_list.value == [(tmp_path / "local/train/cat/0.jpg").read_bytes()]


def test_training_writes_its_model_checkpoints_and_logs_to_a_bucket_and_resumes_there(
        bucket, tmp_path, fake_fmnist):
    import keras
    from conftest import small_run

    from keras_vit.training.run import train

    cfg = small_run(f"{bucket}/run", data_dir=fake_fmnist)
    first = train(cfg)
    assert storage.listdir(f"{bucket}/run") == ["backup", "history.csv", "logs", "metrics.json",
                                                "model.keras"]
    assert "run.json" in storage.listdir(f"{bucket}/run/backup")
    assert storage.read_text(f"{bucket}/run/history.csv").count("\n") == 3  # a header and 2 chunks
    assert _local_files(tmp_path / "cwd") == []
    assert keras.saving.load_model(f"{bucket}/run/model.keras").config.num_classes == 10
    # Started again, it finds its checkpoint in the bucket: nothing left to train.
    again = train(cfg)
    assert again["eval_top1"] == first["eval_top1"]


@pytest.mark.parametrize("name", ["vit_tiny_token_rep.npz", "hf_vit_tiny"])
def test_a_checkpoint_in_a_bucket_loads_as_on_disk(bucket, name):
    import keras_vit
    from conftest import data_path

    local = data_path(name)
    remote = f"{bucket}/checkpoints/{name}"
    if os.path.isdir(local):
        storage.copy_tree(local, remote)
    else:
        tf.io.gfile.copy(local, remote)
    for a, b in zip(keras_vit.create_model(None, weights=local).weights,
                    keras_vit.create_model(None, weights=remote).weights):
        np.testing.assert_array_equal(a, b)
    assert keras_vit.inspect_checkpoint(remote) == keras_vit.inspect_checkpoint(local)
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        keras_vit.create_model(None, weights=f"{bucket}/checkpoints/missing.npz")


def test_figures_and_input_images_go_through_buckets(bucket, tmp_path):
    from PIL import Image

    from keras_vit.visualize.images import load_images
    from keras_vit.visualize.plots import pyplot, save_figure

    fig = pyplot().figure()
    fig.gca().plot([0, 1], [1, 0])
    path = save_figure(fig, f"{bucket}/figures/line.png")
    assert storage.read_bytes(path).startswith(b"\x89PNG")
    for name in ("a.png", "b.png"):
        Image.new("RGB", (12, 12), (200, 10, 10)).save(tmp_path / name)
        tf.io.gfile.copy(str(tmp_path / name), f"{bucket}/photos/{name}")
    images, names = load_images([f"{bucket}/photos"], (8, 8), 3)
    assert images.shape == (2, 8, 8, 3) and names == ["a.png", "b.png"]
    assert load_images([f"{bucket}/photos/b*.png"], (8, 8), 3)[1] == ["b.png"]
