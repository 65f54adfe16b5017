"""pipeline.ingest: the records, the source layouts and their errors (no TFX run)."""

import os

import numpy as np
import pytest
import tensorflow as tf

from pipeline import dedup, ingest
from planting import png


def test_make_example_holds_every_field_and_the_pixel_hash():
    image = png(np.arange(64, dtype=np.uint8).reshape(8, 8))
    ex = ingest.make_example(image, 3, "dress", "train/dress/a.png")
    assert ingest.feature_bytes(ex, ingest.IMAGE) == image
    assert ingest.feature_int(ex, ingest.LABEL) == 3
    assert ingest.feature_bytes(ex, ingest.LABEL_NAME) == b"dress"
    assert ingest.feature_bytes(ex, ingest.SOURCE_ID) == b"train/dress/a.png"
    assert ingest.feature_bytes(ex, ingest.HASH) is None
    (hashed,) = ingest.with_pixel_hashes([ex])
    assert ingest.feature_bytes(hashed, ingest.HASH).decode() == dedup.pixel_hash(image)
    assert ingest.feature_bytes(ingest.make_example(image, 3, "dress", "a", "h0"), ingest.HASH) == b"h0"


def test_eval_slice_is_stable_and_about_the_asked_fraction():
    ids = [f"record-{i}" for i in range(20000)]
    picked = [ingest.in_eval_slice(i, 10.0) for i in ids]
    assert picked == [ingest.in_eval_slice(i, 10.0) for i in ids]
    assert 0.09 < np.mean(picked) < 0.11


def test_source_spec_wants_exactly_one_source():
    with pytest.raises(ValueError, match="exactly one of dataset, image_dir and tfrecords"):
        ingest.SourceSpec(dataset="cifar10", image_dir="/x")
    with pytest.raises(ValueError, match="exactly one"):
        ingest.SourceSpec()
    with pytest.raises(ValueError, match="needs a 'train' pattern"):
        ingest.SourceSpec(tfrecords={"eval": "/x/*"})
    with pytest.raises(ValueError, match="eval_percent"):
        ingest.SourceSpec(dataset="cifar10", eval_percent=0)


def _tree(root, files):
    for rel, data in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


def test_image_folder_layout_maps_validation_to_eval_and_names_classes(tmp_path, caplog):
    img = png(np.zeros((4, 4), np.uint8))
    _tree(tmp_path, {"train/cat/a.png": img, "train/dog/b.jpg": img, "validation/cat/c.png": img,
                     "test/bird/d.png": img, "train/dog/notes.txt": b"x", "train/bird/notes.txt": b"x"})
    splits, classes, files = ingest.image_folder_layout(str(tmp_path))
    assert splits == {"train": "train", "eval": "validation", "test": "test"}
    assert classes == ["bird", "cat", "dog"]  # the union over splits, sorted
    assert [os.path.basename(p) for p, _ in files["train"]] == ["a.png", "b.jpg"]
    # bird's train folder holds no image: the model would have an output it never learns.
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert (f"image_dir {tmp_path}: train/ has no images of 1 of the 3 classes, so a model trained on it "
            "never learns them: bird") in warnings
    assert any("validation/ has no images of 2 of the 3 classes" in w and w.endswith("bird, dog")
               for w in warnings)


def test_image_folder_errors_say_what_is_wrong(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        ingest.image_folder_layout(str(tmp_path / "missing"))
    (tmp_path / "test").mkdir()
    with pytest.raises(ValueError, match="needs a train/ folder"):
        ingest.image_folder_layout(str(tmp_path))
    (tmp_path / "train" / "cat").mkdir(parents=True)
    with pytest.raises(ValueError, match="holds no images"):
        ingest.image_folder_layout(str(tmp_path))


def test_a_corrupt_image_file_is_named(tmp_path):
    _tree(tmp_path, {"train/cat/broken.png": b"\x89PNG\r\n\x1a\nnot really"})
    entry = (str(tmp_path / "train" / "cat" / "broken.png"), "cat")
    record = ingest._read_image_file(entry, str(tmp_path), {"cat": 0})
    with pytest.raises(dedup.BadImageError, match=r"^train/cat/broken.png \(18 bytes\) declares no image "
                                                  r"size .*; skip_bad_records leaves such records out$"):
        ingest.with_pixel_hashes([record])


def _user_record(**features):
    feature = {}
    for k, v in features.items():
        if isinstance(v, int):
            feature[k] = tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))
        else:
            feature[k] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def test_user_records_are_completed_and_incomplete_ones_passed_on():
    image = png(np.ones((4, 4), np.uint8))
    full = ingest._complete_record(_user_record(image=image, label=1), ["a", "b"])
    assert ingest.feature_bytes(full, ingest.LABEL_NAME) == b"b"
    assert ingest.feature_bytes(full, ingest.SOURCE_ID).startswith(b"tfrecord:")
    (hashed,) = ingest.with_pixel_hashes([full])
    assert ingest.feature_bytes(hashed, ingest.HASH).decode() == dedup.pixel_hash(image)
    user = _user_record(image=image, label=1, source_id=b"mine", label_name=b"B")
    kept = ingest._complete_record(user, None)
    assert ingest.feature_bytes(kept, ingest.SOURCE_ID) == b"mine"
    assert ingest.feature_bytes(kept, ingest.LABEL_NAME) == b"B"
    no_image = ingest._complete_record(_user_record(label=0), ["a", "b"])
    assert ingest.feature_bytes(no_image, ingest.IMAGE) is None  # for data validation to report
    assert ingest.feature_int(no_image, ingest.LABEL) == 0
    assert ingest.with_pixel_hashes([no_image]) == [no_image]  # unhashed, not refused


def test_class_names_from_the_labels_seen():
    assert ingest.class_names_from_pairs([(1, "b"), (0, "a"), (3, "d")]) == ["a", "b", "2", "d"]
    with pytest.raises(ValueError, match="named both 'a' and 'z'"):
        ingest.class_names_from_pairs([(0, "a"), (0, "z")])
    with pytest.raises(ValueError, match="no labelled records"):
        ingest.class_names_from_pairs([])


def test_beam_runs_on_the_named_local_runner_unless_told_otherwise():
    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

    from pipeline import run

    def runner(args):
        options = PipelineOptions(args)
        direct = options.view_as(DirectOptions)
        return options.view_as(StandardOptions).runner, direct.direct_running_mode, direct.direct_num_workers

    assert runner(run.beam_args(1)) == ("FnApiRunner", "in_memory", 1)
    assert runner(run.beam_args(4)) == ("FnApiRunner", "multi_processing", 4)
    assert runner(run.beam_args(1, ["--runner=FlinkRunner"]))[0] == "FlinkRunner"
    from apache_beam.options.pipeline_options import S3Options

    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_REGION": "eu-west-1",
           "AWS_SECRET_ACCESS_KEY": "x"}
    s3 = PipelineOptions(run.beam_args(1, env=env)).view_as(S3Options)
    assert (s3.s3_endpoint_url, s3.s3_region_name, s3.s3_secret_access_key) == (
        "http://127.0.0.1:9000", "eu-west-1", None)  # secrets stay in the environment
    from apache_beam.options.pipeline_options import SetupOptions

    def plugins(args):
        return PipelineOptions(args).view_as(SetupOptions).beam_plugins or []

    assert "pipeline.beam_worker" in plugins(run.beam_args(1, s3=True))
    assert "pipeline.beam_worker" not in plugins(run.beam_args(1))
    with pytest.raises(ValueError, match=">= 1"):
        run.beam_args(0)


def _ingest(spec, out_dir):
    """Runs read_source in Beam; returns split -> list of tf.Example, and the class names."""
    import apache_beam as beam

    with beam.Pipeline() as p:
        got = ingest.read_source(p, spec, parallelism=3)
        for split, pcoll in got.splits.items():
            _ = (pcoll | f"S{split}" >> beam.Map(lambda ex: ex.SerializeToString())
                 | f"W{split}" >> beam.io.WriteToTFRecord(os.path.join(out_dir, split)))
    out = {}
    for split in got.splits:
        files = tf.io.gfile.glob(os.path.join(out_dir, split) + "*")
        out[split] = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(files)]
    return out, got.class_names


def test_tfds_source_gives_train_eval_and_test(fake_fmnist, tmp_path):
    from keras_vit import fashion_mnist

    spec = ingest.SourceSpec(dataset="fashion_mnist_local", data_dir=fake_fmnist)
    splits, names = _ingest(spec, str(tmp_path))
    assert names == fashion_mnist.CLASS_NAMES
    assert sorted(splits) == ["eval", "test", "train"]
    assert len(splits["train"]) + len(splits["eval"]) == 96 and len(splits["test"]) == 48
    assert 2 <= len(splits["eval"]) <= 20  # 10% of train, by id hash
    ids = [ingest.feature_bytes(ex, ingest.SOURCE_ID) for s in splits.values() for ex in s]
    assert len(set(ids)) == len(ids)
    ex = splits["test"][0]
    label = ingest.feature_int(ex, ingest.LABEL)
    assert ingest.feature_bytes(ex, ingest.LABEL_NAME).decode() == names[label]
    image = ingest.feature_bytes(ex, ingest.IMAGE)
    assert ingest.feature_bytes(ex, ingest.HASH).decode() == dedup.pixel_hash(image)


def test_each_kind_of_bad_image_stops_ingestion_named_or_is_left_out_and_counted(tmp_path):
    import re

    import apache_beam as beam
    from apache_beam.metrics.metric import MetricsFilter

    from conftest import make_image_folder, write_bad_images

    root = make_image_folder(tmp_path / "images")
    bad = write_bad_images(tmp_path / "images" / "train" / "dog")
    with pytest.raises(Exception, match=r"train/dog/(" + "|".join(bad) + r")\b"):
        _ingest(ingest.SourceSpec(image_dir=root), str(tmp_path / "strict"))

    spec = ingest.SourceSpec(image_dir=root, skip_bad_records=True)
    p = beam.Pipeline()
    got = ingest.read_source(p, spec, parallelism=3)
    for split, pcoll in got.splits.items():
        _ = (pcoll | f"Ids[{split}]" >> beam.Map(lambda ex: ingest.feature_bytes(ex, ingest.SOURCE_ID))
             | f"Text[{split}]" >> beam.Map(bytes.decode)
             | f"Write[{split}]" >> beam.io.WriteToText(str(tmp_path / "kept" / split)))
    result = p.run()
    result.wait_until_finish()
    kept = {split: [line for path in tf.io.gfile.glob(str(tmp_path / "kept" / split) + "*")
                    for line in open(path).read().split()] for split in got.splits}
    name = ingest.bad_records_counter("train")
    counted = result.metrics().query(MetricsFilter().with_name(name))["counters"]
    assert sum(c.committed for c in counted) == len(bad) == 4
    assert len(kept["train"]) + len(kept["eval"]) == 12 and len(kept["test"]) == 6  # every good image
    assert not any(re.search("|".join(bad), i) for v in kept.values() for i in v)


def test_tfrecord_source_learns_class_names_from_the_data(tmp_path):
    image = png(np.ones((4, 4), np.uint8))
    path = str(tmp_path / "train.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for i in range(40):
            w.write(_user_record(image=image, label=i % 3, label_name=[b"a", b"b", b"c"][i % 3],
                                 source_id=f"r{i}".encode()))
    spec = ingest.SourceSpec(tfrecords={"train": path}, eval_percent=25)
    splits, names = _ingest(spec, str(tmp_path / "out"))
    assert names is None  # known after the run, from the (label, name) pairs
    assert sorted(splits) == ["eval", "train"]
    assert len(splits["train"]) + len(splits["eval"]) == 40 and splits["eval"]
