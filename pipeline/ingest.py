"""Reading image data into the pipeline's tf.Example records, as Beam transforms.

Every record holds:
  - `image`: the encoded image (PNG/JPEG/... bytes, as stored at the source);
  - `label`: int64 class index, `label_name`: its name;
  - `source_id`: where the record came from (a TFDS id, a file path, ...);
  - `hash`: sha256 of the decoded RGB pixels, equal for exact copies however encoded.

Three sources: a TFDS dataset, a `split/label/image` folder tree, or TFRecords of
tf.Example with at least `image` and `label`. Output splits are `train`, `eval`
and, when the source has one, `test`. A source's `validation` split becomes `eval`;
without one, `eval` is a fixed slice of train chosen by a hash of `source_id`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from typing import Dict, Iterator, List, Optional, Sequence

import apache_beam as beam
import tensorflow as tf

from keras_vit import data, storage
from pipeline import dedup

IMAGE, LABEL, LABEL_NAME, SOURCE_ID, HASH = "image", "label", "label_name", "source_id", "hash"
SPLITS = ("train", "eval", "test")
_EVAL_NAMES = ("validation", "eval", "val")


def make_example(image: bytes, label: int, label_name: str, source_id: str,
                 pixel_hash: Optional[str] = None) -> tf.train.Example:
    """One pipeline record; without `pixel_hash`, `with_pixel_hashes` adds it."""
    feature = {
        IMAGE: tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
        LABEL: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
        LABEL_NAME: tf.train.Feature(bytes_list=tf.train.BytesList(value=[label_name.encode()])),
        SOURCE_ID: tf.train.Feature(bytes_list=tf.train.BytesList(value=[source_id.encode()])),
    }
    if pixel_hash is not None:
        feature[HASH] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[pixel_hash.encode()]))
    return tf.train.Example(features=tf.train.Features(feature=feature))


def with_pixel_hashes(examples: Sequence[tf.train.Example], skip_bad_records: bool = False,
                      on_skip=None) -> List[tf.train.Example]:
    """The examples with their `hash`, decoding their images together.

    An image the decoder refuses (not an image, over the pixel bound, cut short or
    corrupt) raises BadImageError naming its `source_id`; with `skip_bad_records` its
    record is left out and `on_skip(problem)` is called instead. A record without an
    image passes unhashed, for data validation to report.
    """
    images = [ex for ex in examples if feature_bytes(ex, IMAGE) is not None]
    decoded = iter(dedup.decode_rgb([feature_bytes(ex, IMAGE) for ex in images],
                                    [feature_bytes(ex, SOURCE_ID).decode() for ex in images]))
    kept = []
    for ex in examples:
        rgb, problem = next(decoded) if feature_bytes(ex, IMAGE) is not None else (None, "")
        if problem and not skip_bad_records:
            raise dedup.BadImageError(f"{problem}; skip_bad_records leaves such records out")
        if problem:
            if on_skip is not None:
                on_skip(problem)
            continue
        if rgb is not None:
            ex.features.feature[HASH].bytes_list.value[:] = [dedup.hash_pixels(rgb).encode()]
        kept.append(ex)
    return kept


def feature_bytes(example: tf.train.Example, key: str) -> Optional[bytes]:
    values = example.features.feature[key].bytes_list.value if key in example.features.feature else []
    return values[0] if values else None


def feature_int(example: tf.train.Example, key: str) -> Optional[int]:
    values = example.features.feature[key].int64_list.value if key in example.features.feature else []
    return int(values[0]) if values else None


def in_eval_slice(source_id: str, percent: float) -> bool:
    """A fixed `percent` of records, by a hash of their id (stable across runs and workers)."""
    bucket = int.from_bytes(hashlib.sha256(source_id.encode()).digest()[:8], "big") % 10_000
    return bucket < percent * 100


@dataclasses.dataclass(frozen=True)
class SourceSpec:
    """Where the images come from; exactly one of dataset, image_dir and tfrecords."""

    dataset: Optional[str] = None
    data_dir: Optional[str] = None
    image_dir: Optional[str] = None
    tfrecords: Optional[Dict[str, str]] = None  # split -> file pattern
    class_names: Optional[Sequence[str]] = None  # for tfrecords; default from the data
    eval_percent: float = 10.0  # carved from train when the source has no eval split
    skip_bad_records: bool = False  # leave out (and count) images that do not decode

    def __post_init__(self):
        given = [k for k in ("dataset", "image_dir", "tfrecords") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of dataset, image_dir and tfrecords (got {given or 'none'})")
        if self.tfrecords is not None and "train" not in self.tfrecords:
            raise ValueError(f"tfrecords needs a 'train' pattern, got splits {sorted(self.tfrecords)}")
        if not 0 < self.eval_percent < 100:
            raise ValueError(f"eval_percent must be in (0, 100), got {self.eval_percent}")

    def describe(self) -> str:
        if self.dataset:
            return f"TFDS {self.dataset}"
        if self.image_dir:
            return f"image folder {self.image_dir}"
        return f"TFRecords {self.tfrecords}"


# --- TFDS --------------------------------------------------------------------------


def prepare_tfds(spec: SourceSpec):
    """Prepares the TFDS dataset (no GCS download) and returns its builder."""
    builder = data.tfds().builder(spec.dataset, data_dir=spec.data_dir)
    data.prepare(builder)
    return builder


def _read_tfds_part(part: str, name: str, data_dir: Optional[str], image_key: str, label_key: str,
                    class_names: List[str]) -> Iterator[tf.train.Example]:
    tfds = data.tfds()
    builder = tfds.builder(name, data_dir=data_dir)
    decoders = tfds.decode.PartialDecoding({image_key: True, label_key: True},
                                           decoders={image_key: tfds.decode.SkipDecoding()})
    ds = builder.as_dataset(split=part, decoders=decoders, read_config=tfds.ReadConfig(add_tfds_id=True))
    for ex in ds.as_numpy_iterator():
        label = int(ex[label_key])
        source_id = ex["tfds_id"].decode()
        yield make_example(ex[image_key], label, class_names[label], source_id)


def output_splits(names: Sequence[str], what: str) -> Dict[str, str]:
    """Output split -> the source's split of that role ('eval' may be missing: carve it)."""
    if "train" not in names:
        raise ValueError(f"{what} has no train split (it has {sorted(names)})")
    out = {"train": "train"}
    eval_name = next((n for n in _EVAL_NAMES if n in names), None)
    if eval_name:
        out["eval"] = eval_name
    if "test" in names:
        out["test"] = "test"
    return out


def tfds_splits(builder) -> Dict[str, str]:
    return output_splits(list(builder.info.splits.keys()), builder.name)


def tfds_class_names(builder):
    tfds = data.tfds()
    keys = builder.info.supervised_keys or ("image", "label")
    image_key, label_key = keys[0], keys[1]
    features = builder.info.features
    if (image_key not in features or label_key not in features
            or not isinstance(features[image_key], tfds.features.Image)
            or not isinstance(features[label_key], tfds.features.ClassLabel)):
        raise ValueError(f"{builder.name}: supervised keys {keys} are not an image and a class label")
    return image_key, label_key, list(features[label_key].names)


# --- image folders -----------------------------------------------------------------


def image_folder_layout(root: str):
    """(output split -> source folder, class names, split folder -> [(path, label name)])."""
    folders = data.image_folder_splits(root)
    if "train" not in folders:
        raise ValueError(f"image_dir {root} needs a train/ folder (it has {folders})")
    splits = output_splits(folders, f"image_dir {root}")
    class_names, files = data.list_image_folder(root, list(splits.values()))
    if not files["train"]:
        raise ValueError(f"image_dir {root}/train holds no images ({', '.join(data.IMAGE_EXTENSIONS)})")
    return splits, class_names, files


def _read_image_file(entry, root: str, class_index: Dict[str, int]) -> tf.train.Example:
    path, label_name = entry
    return make_example(storage.read_bytes(path), class_index[label_name], label_name,
                        storage.relpath(path, root))


# --- TFRecords ---------------------------------------------------------------------


def _complete_record(serialized: bytes, class_names: Optional[Sequence[str]]) -> tf.train.Example:
    """A user's tf.Example with `image` and `label`, given the fields it lacks.

    A record missing its image or label is passed on incomplete, for data validation
    to report before training.
    """
    ex = tf.train.Example.FromString(serialized)
    image, label = feature_bytes(ex, IMAGE), feature_int(ex, LABEL)
    source_id = feature_bytes(ex, SOURCE_ID)
    source_id = source_id.decode() if source_id else "tfrecord:" + hashlib.sha256(serialized).hexdigest()[:20]
    name = feature_bytes(ex, LABEL_NAME)
    if name is None and label is not None:
        name = (class_names[label] if class_names and 0 <= label < len(class_names) else str(label)).encode()
    out = tf.train.Example()
    if image is not None:
        out.features.feature[IMAGE].bytes_list.value.append(image)
    if label is not None:
        out.features.feature[LABEL].int64_list.value.append(label)
        out.features.feature[LABEL_NAME].bytes_list.value.append(name)
    out.features.feature[SOURCE_ID].bytes_list.value.append(source_id.encode())
    return out


# --- the transform -----------------------------------------------------------------


def bad_records_counter(split: str) -> str:
    """The Beam counter (namespace keras_vit) of the records of `split` left out as bad."""
    return f"bad_records_{split}"


def _hash_batch(batch, split: str, skip_bad_records: bool):
    def skipped(problem):
        beam.metrics.Metrics.counter("keras_vit", bad_records_counter(split)).inc()
        logging.warning("ImageExampleGen left out a bad record: %s", problem)

    return with_pixel_hashes(batch, skip_bad_records, skipped)


def _hashed(pcoll, split: str, skip_bad_records: bool):
    # In batches: the decoder's per-call cost is ten times its per-image cost.
    return (pcoll | f"Batch[{split}]" >> beam.BatchElements(min_batch_size=8, max_batch_size=256)
            | f"Hash[{split}]" >> beam.FlatMap(_hash_batch, split, skip_bad_records))


@dataclasses.dataclass
class Ingested:
    """What `read_source` built: one PCollection of tf.Example per output split."""

    splits: Dict[str, beam.PCollection]
    class_names: Optional[List[str]]  # None: known only after the run (tfrecords without names)
    label_names: Optional[beam.PCollection] = None  # (label, name) pairs seen, for that case


def read_source(p: beam.Pipeline, spec: SourceSpec, parallelism: int = 8) -> Ingested:
    """Adds the reading of `spec` to `p`."""
    carve = None
    if spec.dataset:
        builder = prepare_tfds(spec)
        image_key, label_key, class_names = tfds_class_names(builder)
        sources, tfds = {}, data.tfds()
        for out_split, src_split in tfds_splits(builder).items():
            n = min(parallelism, builder.info.splits[src_split].num_examples) or 1
            parts = tfds.even_splits(src_split, n=n)
            sources[out_split] = (
                p | f"Parts[{out_split}]" >> beam.Create(parts)
                | f"ReadTFDS[{out_split}]" >> beam.FlatMap(
                    _read_tfds_part, spec.dataset, spec.data_dir, image_key, label_key, class_names))
        if "eval" not in sources:
            carve = sources.pop("train")
    elif spec.image_dir:
        splits, class_names, files = image_folder_layout(spec.image_dir)
        index = {n: i for i, n in enumerate(class_names)}
        sources = {
            out_split: (p | f"List[{out_split}]" >> beam.Create(files[folder])
                        | f"Read[{out_split}]" >> beam.Map(_read_image_file, spec.image_dir, index))
            for out_split, folder in splits.items()}
        if "eval" not in sources:
            carve = sources.pop("train")
    else:
        class_names = list(spec.class_names) if spec.class_names else None
        sources = {}
        for split, pattern in spec.tfrecords.items():
            out_split = "eval" if split in _EVAL_NAMES else split
            if out_split not in SPLITS:
                raise ValueError(f"tfrecords split {split!r} is not one of train, eval (validation), test")
            if not storage.glob(pattern):
                raise FileNotFoundError(f"tfrecords {split}: no files match {pattern}")
            sources[out_split] = (
                p | f"ReadTFRecords[{out_split}]" >> beam.io.ReadFromTFRecord(
                    pattern, coder=beam.coders.BytesCoder())
                | f"Complete[{out_split}]" >> beam.Map(_complete_record, class_names))
        if "eval" not in sources:
            carve = sources.pop("train")
    sources = {split: _hashed(pcoll, split, spec.skip_bad_records) for split, pcoll in sources.items()}
    if carve is not None:
        carve = _hashed(carve, "train", spec.skip_bad_records)
        parts = carve | "CarveEval" >> beam.Partition(
            lambda ex, n, pct: int(in_eval_slice(feature_bytes(ex, SOURCE_ID).decode(), pct)), 2,
            spec.eval_percent)
        sources["train"], sources["eval"] = parts[0], parts[1]
    label_names = None
    if class_names is None:
        label_names = (
            sources["train"] | "LabelNames" >> beam.FlatMap(
                lambda ex: [(feature_int(ex, LABEL), feature_bytes(ex, LABEL_NAME).decode())]
                if feature_int(ex, LABEL) is not None else [])
            | "DistinctLabels" >> beam.Distinct())
    return Ingested(sources, class_names, label_names)


def class_names_from_pairs(pairs) -> List[str]:
    """Class names from the (label, name) pairs of the training data: labels 0..max."""
    by_label: Dict[int, str] = {}
    for label, name in pairs:
        if label in by_label and by_label[label] != name:
            raise ValueError(f"label {label} is named both {by_label[label]!r} and {name!r}")
        by_label[label] = name
    if not by_label:
        raise ValueError("the training data holds no labelled records")
    if min(by_label) < 0:
        raise ValueError(f"negative label {min(by_label)} in the training data")
    return [by_label.get(i, str(i)) for i in range(max(by_label) + 1)]
