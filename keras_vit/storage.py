"""Paths a user gives, on local disk or object storage (gs://, s3://, ...), through tf.io.gfile.

Object stores have no directories and no atomic rename, so `publish` makes a
directory visible under its final name only once all of it is written, and
`write_text` writes a file whole or not at all on local disk too.
"""

from __future__ import annotations

import os
import posixpath
import uuid

import tensorflow as tf

# Copied last when a SavedModel is published on an object store: TF Serving's load of
# a version directory fails (and is retried) until its graph is there.
SAVED_MODEL_GRAPH = "saved_model.pb"


class StorageError(OSError):
    """A path that cannot be used: an unknown scheme, a missing bucket, no access."""


def is_url(path: str) -> bool:
    """True for `scheme://...` paths (gs://, s3://, ram://, hdfs://)."""
    return "://" in str(path)


def absolute(path: str) -> str:
    """A local path made absolute; a URL as it is."""
    return str(path) if is_url(path) else os.path.abspath(path)


def join(*parts: str) -> str:
    return posixpath.join(*parts) if is_url(parts[0]) else os.path.join(*parts)


def parent(path: str) -> str:
    """The directory holding `path` (local paths made absolute first)."""
    if is_url(path):
        scheme, rest = str(path).split("://", 1)
        return f"{scheme}://{posixpath.dirname(rest.rstrip('/'))}"
    return os.path.dirname(os.path.abspath(path))


def basename(path: str) -> str:
    if is_url(path):
        return posixpath.basename(str(path).rstrip("/"))
    return os.path.basename(os.path.normpath(path))


def relpath(path: str, root: str) -> str:
    """`path` relative to `root`, with "/" separators in a URL."""
    if is_url(path):
        root = str(root).rstrip("/") + "/"
        if not str(path).startswith(root):
            raise ValueError(f"{path} is not under {root}")
        return str(path)[len(root):]
    return os.path.relpath(path, root)


def check(path: str) -> str:
    """`path`, once its filesystem answers: an unknown scheme or an unreachable store
    raises StorageError naming the path, before any work is done."""
    try:
        tf.io.gfile.exists(path)
    except tf.errors.UnimplementedError as e:
        scheme = str(path).split("://", 1)[0]
        hint = (" It comes with TensorFlow I/O: install the tensorflow-io build that matches your "
                "TensorFlow and `import tensorflow_io` first." if scheme == "s3" else "")
        raise StorageError(f"{path}: TensorFlow has no filesystem for {scheme}://.{hint}") from e
    except tf.errors.OpError as e:
        raise StorageError(f"{path}: {e.message}") from e
    return path


def makedirs(path: str) -> None:
    tf.io.gfile.makedirs(path)


def exists(path: str) -> bool:
    return tf.io.gfile.exists(path)


def isdir(path: str) -> bool:
    return tf.io.gfile.isdir(path)


def listdir(path: str) -> list:
    """Entry names, without the trailing "/" some filesystems add to directories."""
    return sorted(name.rstrip("/") for name in tf.io.gfile.listdir(path))


def read_text(path: str) -> str:
    with tf.io.gfile.GFile(path, "r") as f:
        return f.read()


def read_bytes(path: str) -> bytes:
    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read()


def write_text(path: str, text: str) -> str:
    """`write_bytes` of `text` in UTF-8."""
    return write_bytes(path, text.encode())


def write_bytes(path: str, data: bytes) -> str:
    """Writes `data` to `path` whole, making its folder: it is written beside `path` and
    renamed over it (atomic on local disk; on object stores a copy of one object, which
    appears at once), so no reader sees half of it. Returns `path`."""
    makedirs(parent(path))
    partial = f"{path}.partial-{uuid.uuid4().hex[:8]}"
    try:
        with tf.io.gfile.GFile(partial, "wb") as f:
            f.write(data)
        tf.io.gfile.rename(partial, path, overwrite=True)
    finally:
        if tf.io.gfile.exists(partial):
            tf.io.gfile.remove(partial)
    return path


def remove_tree(path: str) -> None:
    if tf.io.gfile.exists(path):
        tf.io.gfile.rmtree(path)


def files_under(root: str) -> list:
    """(path, path relative to `root` with "/" separators) of every file under `root`,
    sorted by the relative path."""
    root = root.rstrip("/")
    out = []
    for dirpath, _, filenames in tf.io.gfile.walk(root):
        rel_dir = dirpath.rstrip("/")[len(root):].lstrip("/").replace(os.sep, "/")
        out += [(join(dirpath, name), f"{rel_dir}/{name}" if rel_dir else name) for name in filenames]
    # A listing by prefix can name what is not there (TF's ram:// lists the files of
    # `assets.extra/` under `assets/` as `.extra/...`): keep what exists.
    return sorted((item for item in out if tf.io.gfile.exists(item[0])), key=lambda item: item[1])


def copy_tree(src: str, dst: str, last=()) -> None:
    """Copies the files under `src` to `dst`; files named in `last` after all others."""
    files = files_under(src)
    for source, rel in sorted(files, key=lambda item: posixpath.basename(item[1]) in last):
        target = join(dst, *rel.split("/"))
        tf.io.gfile.makedirs(parent(target))
        tf.io.gfile.copy(source, target, overwrite=True)


def publish(final: str, write) -> str:
    """Makes a directory appear at `final` with everything `write(directory)` puts in it,
    or not at all.

    `write` fills a hidden staging directory beside `final` (TF Serving loads only
    integer-named versions). On local disk the staging directory is then renamed to
    `final`, which is atomic. Object stores cannot rename a directory: the files are
    copied to `final` with the SavedModel graph last, so a server polling the store
    finds no loadable version until every variable is there. If anything fails, the
    staging directory and any partial copy are removed and the error is raised.

    Returns:
      `final`.
    """
    if exists(final):
        raise FileExistsError(f"{final} exists; TF Serving versions are immutable, pick another version")
    staging = join(parent(final), f".{basename(final)}-staging-{uuid.uuid4().hex[:8]}")
    copied = False
    try:
        write(staging)
        if is_url(final):
            copied = True
            copy_tree(staging, final, last=(SAVED_MODEL_GRAPH,))
        else:
            os.rename(staging, final)
    except BaseException:
        if copied:
            _remove_quietly(final)
        raise
    finally:
        _remove_quietly(staging)
    return final


def _remove_quietly(path: str) -> None:
    try:
        remove_tree(path)
    except tf.errors.OpError as e:
        print(f"Could not remove {path}: {e.message}; remove it by hand", flush=True)
