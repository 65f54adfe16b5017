"""tf.data input for training and evaluation: TFDS datasets and image folders.

    source = open_source("fashion_mnist_local")          # offline, from the Debian IDX files
    train = make_dataset(source, "train", image_size=32, batch_size=256, training=True)

Any TFDS image-classification name works (`cifar10`, `oxford_iiit_pet`, ...); it is
prepared from its own sources with `try_download_gcs=False`. `image_dir` reads a
`split/label/image` tree of JPEG, PNG, GIF or BMP files (`ImageFolderSource`).
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import sys
import zlib
from typing import Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from keras_vit import extras, preprocessing, storage

AUTOTUNE = tf.data.AUTOTUNE


def tfds():
    """The `tensorflow_datasets` module, with `fashion_mnist_local` registered: imported
    only where a TFDS dataset is used, so the model package needs no TFDS."""
    tensorflow_datasets = extras.require("tensorflow_datasets", "data")
    from keras_vit import fashion_mnist  # noqa: F401  (registers fashion_mnist_local)

    return tensorflow_datasets


@dataclasses.dataclass
class Source:
    """A prepared dataset: its builder and what the pipeline needs to know of it."""

    name: str
    builder: object  # tfds.core.DatasetBuilder
    image_key: str
    label_key: str
    id_key: str

    @property
    def class_names(self) -> List[str]:
        return list(self.builder.info.features[self.label_key].names)

    @property
    def num_classes(self) -> int:
        return self.builder.info.features[self.label_key].num_classes

    @property
    def splits(self) -> dict:
        return {name: split.num_examples for name, split in self.builder.info.splits.items()}

    def num_examples(self, split: str) -> int:
        return self.builder.info.splits[split].num_examples

    def raw(self, split: str, shuffle_files: bool = False, seed: Optional[int] = None) -> tf.data.Dataset:
        """Undecoded examples: dicts with the encoded image bytes, the label and a record id."""
        tfds_ = tfds()
        decoders = {self.image_key: tfds_.decode.SkipDecoding()}
        kwargs = dict(split=split, shuffle_files=shuffle_files)
        if self.id_key == "tfds_id":
            # Read only the image (undecoded) and the label: boxes, masks and the rest
            # are never parsed. (ImageFolder takes plain decoders only.)
            decoders = tfds_.decode.PartialDecoding({self.image_key: True, self.label_key: True},
                                                    decoders=decoders)
            kwargs["read_config"] = tfds_.ReadConfig(add_tfds_id=True, shuffle_seed=seed)
        kwargs["decoders"] = decoders
        return self.builder.as_dataset(**kwargs)


@dataclasses.dataclass
class TFRecordSource:
    """tf.Example files (e.g. a TFX Examples artifact) with the interface of `Source`.

    Each record holds the encoded image under `image_key`, an int64 label under
    `label_key` and a string id under `id_key`.
    """

    name: str
    files: Dict[str, Sequence[str]]  # split -> file patterns
    class_names: List[str]
    compression: Optional[str] = "GZIP"
    image_key: str = "image"
    label_key: str = "label"
    id_key: str = "source_id"
    counts: Dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def splits(self) -> dict:
        return {split: self.num_examples(split) for split in self.files}

    def _paths(self, split: str) -> List[str]:
        if split not in self.files:
            raise ValueError(f"{self.name} has no split {split!r} (it has {sorted(self.files)})")
        paths = sorted(p for pattern in self.files[split] for p in storage.glob(pattern))
        if not paths:
            raise FileNotFoundError(f"{self.name} {split}: no files match {list(self.files[split])}")
        return paths

    def num_examples(self, split: str) -> int:
        if split not in self.counts:
            records = tf.data.TFRecordDataset(self._paths(split), compression_type=self.compression)
            self.counts[split] = int(records.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1).numpy())
        return self.counts[split]

    def raw(self, split: str, shuffle_files: bool = False, seed: Optional[int] = None) -> tf.data.Dataset:
        paths = self._paths(split)
        files = tf.data.Dataset.from_tensor_slices(paths)
        if shuffle_files:
            files = files.shuffle(len(paths), seed=seed)
        records = files.interleave(
            lambda f: tf.data.TFRecordDataset(f, compression_type=self.compression),
            cycle_length=min(len(paths), 4), num_parallel_calls=AUTOTUNE, deterministic=not shuffle_files)
        spec = {self.image_key: tf.io.FixedLenFeature([], tf.string),
                self.label_key: tf.io.FixedLenFeature([], tf.int64),
                self.id_key: tf.io.FixedLenFeature([], tf.string, default_value="")}
        return records.map(lambda r: tf.io.parse_single_example(r, spec), num_parallel_calls=AUTOTUNE,
                           deterministic=not shuffle_files)


def quiet_info_logs() -> None:
    """Raises absl's level to WARNING unless `--verbosity` was given.

    TFDS logs every file it opens at INFO, and TensorFlow each step of writing a
    SavedModel, which buries a command's own progress.
    """
    from absl import flags, logging

    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    tf_logs_through_absl_only()


def tf_logs_through_absl_only() -> None:
    """Prints each TensorFlow log record once, through absl's handler, in an absl app.

    TensorFlow gives its logger a handler of its own when it is imported before absl
    puts one on the root logger, and each record then went to both.
    """
    import logging

    tf_logger = logging.getLogger("tensorflow")
    for handler in list(tf_logger.handlers):
        if type(handler) is logging.StreamHandler:
            tf_logger.removeHandler(handler)


def prepare(builder) -> None:
    """`download_and_prepare` from the dataset's own sources (no GCS), one process at a time.

    Two processes preparing one dataset at once (the workers of a job, parallel
    tests) would race to rename their copies into place; a lock file beside the
    dataset makes the second wait, then find it prepared.
    """
    config = tfds().download.DownloadConfig(try_download_gcs=False)
    lock_path = builder.data_dir.rstrip("/") + ".lock"
    if "://" in lock_path:  # a bucket: no local lock to take
        builder.download_and_prepare(download_config=config)
        return
    os.makedirs(os.path.dirname(lock_path), exist_ok=True)
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            builder.download_and_prepare(download_config=config)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def warn_missing_classes(where: str, class_names: Sequence[str],
                         present: Dict[str, set]) -> Dict[str, List[str]]:
    """Warns of each split that has no images of some classes; returns {split: missing}.

    An image folder's classes are the union over its splits, so a class folder only in
    test/ (or misspelt in train/) gives the model an output it never learns, and a test
    accuracy that counts its images as wrong. Not an error: a split may omit classes on
    purpose.
    """
    from absl import logging

    missing = {split: [c for c in class_names if c not in have] for split, have in present.items()}
    missing = {split: names for split, names in missing.items() if names}
    for split, names in sorted(missing.items()):
        consequence = ("a model trained on it never learns them" if split == "train"
                       else "its accuracy says nothing of them")
        logging.warning("%s: %s/ has no images of %d of the %d classes, so %s: %s", where, split, len(names),
                        len(class_names), consequence, ", ".join(names))
    return missing


IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".gif", ".bmp")  # what preprocessing.decode_image reads


def image_folder_splits(root: str) -> List[str]:
    """The split folders (`train`, `test`, ...) of an image folder, sorted."""
    if not storage.isdir(root):
        raise FileNotFoundError(f"image_dir {root} is not a directory")
    return [d for d in storage.listdir(root) if storage.isdir(storage.join(root, d))]


def list_image_folder(root: str, folders: Optional[Sequence[str]] = None):
    """(class names, {folder: [(image path, class name)] sorted}) of a `folder/class/image` tree.

    `folders`: the split folders to read (default every one). The classes are the
    union over them; a folder lacking some is warned of (`warn_missing_classes`).
    Files of other extensions are left out.
    """
    if folders is None:
        folders = image_folder_splits(root)
    files, classes = {}, set()
    for folder in folders:
        entries = []
        for label in storage.listdir(storage.join(root, folder)):
            label_dir = storage.join(root, folder, label)
            if not storage.isdir(label_dir):
                continue
            classes.add(label)
            entries += [(storage.join(label_dir, f), label) for f in storage.listdir(label_dir)
                        if f.lower().endswith(IMAGE_EXTENSIONS)]
        files[folder] = entries
    class_names = sorted(classes)
    warn_missing_classes(f"image_dir {root}", class_names,
                         {folder: {label for _, label in entries} for folder, entries in files.items()})
    return class_names, files


@dataclasses.dataclass
class ImageFolderSource:
    """A `split/class/image` tree with the interface of `Source`.

    Reads the formats serving does (JPEG, PNG, GIF, BMP; tfds's ImageFolder reads only
    JPEG and PNG and skips the rest without a word). Each split's files are in a fixed
    shuffled order, so that a shuffle buffer smaller than the split still mixes classes
    and evaluation results line up with `image/filename` ids run after run.
    """

    root: str
    image_key: str = "image"
    label_key: str = "label"
    id_key: str = "image/filename"

    def __post_init__(self):
        self.class_names, files = list_image_folder(self.root)
        index = {name: i for i, name in enumerate(self.class_names)}
        self._files = {}
        for split, entries in files.items():
            order = np.random.RandomState(zlib.crc32(split.encode())).permutation(len(entries))
            self._files[split] = [(entries[i][0], index[entries[i][1]]) for i in order]

    @property
    def name(self) -> str:
        return f"image_folder:{self.root}"

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def splits(self) -> dict:
        return {split: len(entries) for split, entries in self._files.items()}

    def num_examples(self, split: str) -> int:
        if split not in self._files:
            raise ValueError(f"{self.name} has no split {split!r} (it has {sorted(self._files)}; "
                             "an image folder's splits are its folders, and take no slices)")
        return len(self._files[split])

    def raw(self, split: str, shuffle_files: bool = False, seed: Optional[int] = None) -> tf.data.Dataset:
        self.num_examples(split)
        paths = [p for p, _ in self._files[split]]
        ds = tf.data.Dataset.from_tensor_slices(
            (tf.constant(paths, tf.string), tf.constant([label for _, label in self._files[split]], tf.int64),
             tf.constant([storage.relpath(p, self.root) for p in paths], tf.string)))
        if shuffle_files:  # paths only: cheap, and a different order each pass
            ds = ds.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)

        def read(path, label, relpath):
            return {self.image_key: tf.io.read_file(path), self.label_key: label, self.id_key: relpath}

        return ds.map(read, num_parallel_calls=AUTOTUNE, deterministic=not shuffle_files)


def open_source(dataset: Optional[str] = "fashion_mnist_local", data_dir: Optional[str] = None,
                image_dir: Optional[str] = None, image_key: Optional[str] = None,
                label_key: Optional[str] = None):
    """Prepares a TFDS dataset as a `Source`, or lists an image folder as an `ImageFolderSource`.

    Args:
      dataset: a TFDS name, with an optional config (`fashion_mnist_local/mini`).
      data_dir: where TFDS keeps prepared data (default `~/tensorflow_datasets`).
      image_dir: a `split/label/image` tree; used instead of `dataset` when given.
      image_key, label_key: feature names; default the dataset's supervised keys.
    """
    if image_dir is not None:
        return ImageFolderSource(image_dir)
    tfds_ = tfds()
    try:
        builder = tfds_.builder(dataset, data_dir=data_dir)
    except tfds_.core.registered.DatasetNotFoundError as e:
        raise ValueError(f"unknown TFDS dataset {dataset!r}: {e}") from e
    prepare(builder)
    keys = builder.info.supervised_keys or ("image", "label")
    image_key = image_key or keys[0]
    label_key = label_key or keys[1]
    features = builder.info.features
    for key, kind in ((image_key, tfds_.features.Image), (label_key, tfds_.features.ClassLabel)):
        if key not in features or not isinstance(features[key], kind):
            raise ValueError(f"{dataset}: feature {key!r} is not a {kind.__name__}; "
                             "pass image_key/label_key for this dataset")
    return Source(dataset, builder, image_key, label_key, "tfds_id")


def eval_split(source, split: Optional[str] = None, option: str = "eval_split") -> str:
    """`split`, or by default the source's test split, else its validation split.

    `option`: what the caller's user sets to name another (a field or a flag), for the error.
    """
    found = split or next((s for s in ("test", "validation") if s in source.splits), None)
    if found is None:
        raise ValueError(f"{source.name} has no test or validation split to evaluate on (it has "
                         f"{sorted(source.splits)}); name one with {option}")
    return found


def labels(source, split: str) -> np.ndarray:
    """The split's labels int64 `[N]` in record order, read without decoding an image."""
    if isinstance(source, ImageFolderSource):  # known from the listing: no file read
        source.num_examples(split)
        return np.array([label for _, label in source._files[split]], np.int64)
    ds = source.raw(split).map(lambda ex: tf.cast(ex[source.label_key], tf.int64),
                               num_parallel_calls=AUTOTUNE).batch(4096)
    out = np.concatenate([b.numpy() for b in ds] or [np.zeros(0, np.int64)])
    if len(out) != source.num_examples(split):
        raise ValueError(f"{source.name} {split}: read {len(out)} labels, its metadata says "
                         f"{source.num_examples(split)} records")
    return out


class DataStats:
    """The bad records `skip_bad_records=True` dropped, each once however many passes
    met it (a training split is read again every epoch)."""

    def __init__(self):
        self._seen = tf.lookup.experimental.MutableHashTable(tf.string, tf.int64, default_value=0)

    def add(self, problem: tf.Tensor) -> tf.Tensor:
        """Records one bad record's problem (scalar string); returns an op."""
        return self._seen.insert(problem, tf.constant(1, tf.int64))

    @property
    def skipped_count(self) -> int:
        return int(self._seen.size().numpy())

    @property
    def skipped(self) -> List[str]:
        """What was wrong with each skipped record (it starts with the record's name), sorted."""
        keys, _ = self._seen.export()
        return sorted(k.decode("utf-8", "replace") for k in keys.numpy())


def bad_record(error: Exception) -> Optional[str]:
    """What `make_dataset` said of a bad record, from the error that reached its reader
    (model.fit, a loop over the dataset), or None for any other error."""
    import re

    found = re.search(r"(?:assertion failed: \[|Summarized data: b')(.+? record .+?)(?:\]|')\n",
                      str(error) + "\n")
    return found.group(1) if isinstance(error, tf.errors.InvalidArgumentError) and found else None


def make_dataset(
    source: Source,
    split: str,
    *,
    image_size,
    batch_size: int,
    training: bool,
    channels: int = 3,
    shuffle_buffer: int = 10_000,
    cache: bool = False,
    seed: int = 0,
    deterministic: bool = False,
    skip_bad_records: bool = False,
    stats: Optional[DataStats] = None,
    crop_area=(0.05, 1.0),
    examples: Optional[Sequence[int]] = None,
) -> tf.data.Dataset:
    """Batches of `(images float32 [B, h, w, channels] in [-1, 1], labels int32 [B])`.

    Training: shuffled and repeated forever, Inception crop and flip, full batches.
    Evaluation: one pass in order, of known length, resize only, the last batch may be short.

    A bad record raises InvalidArgumentError naming it and saying what is wrong: an
    image that `preprocessing.try_decode_image` refuses (not an image, over the pixel
    bound, truncated or corrupt), or a label out of range. With `skip_bad_records` it
    is dropped instead, printed to stderr and recorded in `stats`.

    `examples`: for evaluation, the positions in `split` (as `labels` orders it) of the
    only records to read, e.g. the ones a few-shot evaluation draws; they come in
    ascending order.
    """
    size = preprocessing.image_hw(image_size)
    num_classes = source.num_classes
    ds = source.raw(split, shuffle_files=training, seed=seed)
    count = None
    if examples is not None:
        if training:
            raise ValueError("examples selects evaluation records; training reads the whole split")
        total = source.num_examples(split)
        keep = np.zeros(total, bool)
        picked = np.asarray(examples, np.int64).reshape(-1)
        if picked.size and (picked.min() < 0 or picked.max() >= total):
            raise ValueError(f"examples must be positions in [0, {total}) of {source.name} {split}")
        keep[picked] = True
        count = int(keep.sum())
        keep = tf.constant(keep)

        def kept(index, _):
            return tf.gather(keep, index)

        def record(_, ex):
            return ex

        # Filtering the undecoded records costs a read, not a decode, of the rest.
        ds = ds.enumerate().filter(kept).map(record)
    if cache:
        ds = ds.cache()
    if training:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    elif ds.cardinality() == tf.data.UNKNOWN_CARDINALITY:
        # A TFRecord read has no known length, and Keras then ends every evaluate and
        # predict over it with "Your input ran out of data; interrupting training".
        # The count is known (and checked: a wrong one fails the pass).
        ds = ds.apply(tf.data.experimental.assert_cardinality(
            source.num_examples(split) if count is None else count))

    def decode(ex):
        record = tf.strings.join([f"{source.name} {split} record ", tf.strings.as_string(ex[source.id_key])])
        label = tf.cast(ex[source.label_key], tf.int64)
        # Training decodes at full size and crops; evaluation decodes as the exported
        # serving graph does (a large JPEG at a reduced scale).
        image, problem = preprocessing.try_decode_image(ex[source.image_key], channels, label=record,
                                                        min_size=None if training else size)
        problem = tf.cond((label >= 0) & (label < num_classes), lambda: problem, lambda: tf.strings.join(
            [record, ": label ", tf.strings.as_string(label), f" is outside [0, {num_classes})"]))
        if not skip_bad_records:
            with tf.control_dependencies([tf.debugging.Assert(tf.equal(problem, ""), [problem])]):
                problem = tf.identity(problem)
        return image, tf.cast(label, tf.int32), problem

    if skip_bad_records:
        stats = stats or DataStats()

    def counted(image, label, problem):
        # Sequential after the parallel map, so each drop is recorded before the next
        # record is read.
        bad = tf.not_equal(problem, "")

        def skip():
            with tf.control_dependencies([stats.add(problem)]):
                tf.print(tf.strings.join(["skipping a bad record: ", problem]), output_stream=sys.stderr)
            return tf.constant(0)

        with tf.control_dependencies([tf.cond(bad, skip, lambda: tf.constant(0))]):
            return tf.logical_not(bad)

    def prepare(index, example):
        image, label, _ = example
        if training:
            image = preprocessing.train_image(image, size, tf.stack([tf.cast(seed, tf.int64), index]),
                                              area_range=crop_area)
        else:
            image = preprocessing.eval_image(image, size)
        return tf.ensure_shape(image, [*size, channels]), label

    # Evaluation keeps the records' order (results line up with ids); training may
    # trade order for speed unless `deterministic`.
    ordered = deterministic or not training
    ds = ds.map(decode, num_parallel_calls=AUTOTUNE, deterministic=ordered)
    if skip_bad_records:
        ds = ds.filter(counted)
    if training:
        # After the filter: a split whose every record is bad then ends instead of
        # being read forever. The crop's seed counts records across passes.
        ds = ds.repeat()
    ds = ds.enumerate().map(prepare, num_parallel_calls=AUTOTUNE, deterministic=ordered)
    ds = ds.batch(batch_size, drop_remainder=training, num_parallel_calls=AUTOTUNE, deterministic=ordered)
    options = tf.data.Options()
    options.deterministic = ordered
    return ds.with_options(options).prefetch(AUTOTUNE)
