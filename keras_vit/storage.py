"""Paths a user gives, on local disk or object storage (gs://, s3://, ...), through tf.io.gfile.

Object stores have no directories and no atomic rename, so `publish` makes a
directory visible under its final name only once all of it is written, and
`write_text` writes a file whole or not at all on local disk too.
"""

from __future__ import annotations

import os
import posixpath
import sys
import uuid

import tensorflow as tf

# Copied last when a SavedModel is published on an object store: TF Serving's load of
# a version directory fails (and is retried) until its graph is there.
SAVED_MODEL_GRAPH = "saved_model.pb"


class StorageError(OSError):
    """A path that cannot be used: an unknown scheme, a missing bucket, no access."""


_s3 = {"loaded": False}


def s3_environment(env) -> dict:
    """TensorFlow I/O's S3 settings from the standard AWS variables in `env`: the
    endpoint (`AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL`, for MinIO, Ceph and other
    stores) becomes `S3_ENDPOINT`, plain http without TLS checks where it says http.
    Variables already set are kept. The credentials and `AWS_REGION` are read as they are."""
    out = {}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint and "S3_ENDPOINT" not in env:
        out["S3_ENDPOINT"] = endpoint
        if endpoint.startswith("http://"):
            out.update(S3_USE_HTTPS="0", S3_VERIFY_SSL="0")
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region and "AWS_REGION" not in env:
        out["AWS_REGION"] = region
    return out


def _load_filesystem(path) -> None:
    # s3:// is TensorFlow I/O's plugin: loaded, configured from the AWS variables, the
    # first time this process meets such a path. Keras and TFX, which call tf.io.gfile
    # themselves, then find it too.
    if not _s3["loaded"] and str(path).startswith("s3://"):
        load_s3()


def load_s3() -> bool:
    """Gives this process's tf.io.gfile s3:// (TensorFlow I/O), configured from the AWS
    variables (`s3_environment`), for code that reads s3:// paths through TensorFlow
    without this module (TFMA on a Beam worker). False if TensorFlow I/O is missing."""
    if not _s3["loaded"]:
        os.environ.update(s3_environment(os.environ))
        try:
            import tensorflow_io  # noqa: F401  (registers s3://)
        except ImportError:
            return False  # `check` says what to install
        _s3["loaded"] = True
    return True


def _as_directory(path) -> str:
    # A bucket's root is a directory only with its slash to TensorFlow I/O's S3
    # ("s3://bucket" is not found, "s3://bucket/" lists).
    path = str(path)
    if is_url(path) and "/" not in path.split("://", 1)[1]:
        return path + "/"
    return path


def s3_loaded() -> bool:
    """Whether this process has used TensorFlow I/O's S3 filesystem (see `exit_now`)."""
    return _s3["loaded"]


def exit_now(status: int) -> None:
    """Ends the process with `status` once its output is flushed. After TensorFlow I/O's
    S3 client has been used, the interpreter's normal exit aborts ("pure virtual method
    called", status 134) in the client's static destructors: this skips them."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


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


def check(path: str, timeout_s: float = 10.0) -> str:
    """`path`, once its filesystem answers: an unknown scheme, and for s3:// a missing
    bucket, missing or refused credentials or an unreachable endpoint (within about
    `timeout_s`), raise StorageError naming the path, before any work is done."""
    _load_filesystem(path)
    if str(path).startswith("s3://"):
        if not _s3["loaded"]:
            raise StorageError(f"{path}: TensorFlow has no filesystem for s3://. It comes with TensorFlow "
                               "I/O: pip install 'keras-vit[s3]', or the tensorflow-io build that matches "
                               "your TensorFlow.")
        _check_bucket(path, timeout_s)
        return path
    try:
        tf.io.gfile.exists(path)
    except tf.errors.UnimplementedError as e:
        scheme = str(path).split("://", 1)[0]
        raise StorageError(f"{path}: TensorFlow has no filesystem for {scheme}://.") from e
    except tf.errors.OpError as e:
        raise StorageError(f"{path}: {e.message}") from e
    return path


def _check_bucket(path: str, timeout_s: float) -> None:
    # TensorFlow I/O reports a missing bucket as a missing file and retries an
    # unreachable endpoint for minutes: ask S3 itself, briefly.
    import boto3
    import botocore.config
    import botocore.exceptions

    bucket = str(path)[len("s3://"):].split("/", 1)[0]
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    where = f" at {endpoint}" if endpoint else ""
    config = botocore.config.Config(connect_timeout=timeout_s / 2, read_timeout=timeout_s / 2,
                                    retries={"max_attempts": 1})
    try:
        boto3.client("s3", endpoint_url=endpoint, config=config).head_bucket(Bucket=bucket)
    except botocore.exceptions.NoCredentialsError as e:
        raise StorageError(f"{path}: no AWS credentials (set AWS_ACCESS_KEY_ID and "
                           "AWS_SECRET_ACCESS_KEY)") from e
    except botocore.exceptions.EndpointConnectionError as e:
        raise StorageError(f"{path}: cannot reach the S3 endpoint{where} ({e})") from e
    except (botocore.exceptions.ConnectTimeoutError, botocore.exceptions.ReadTimeoutError) as e:
        raise StorageError(f"{path}: the S3 endpoint{where} did not answer within {timeout_s:g} s") from e
    except botocore.exceptions.ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        reason = {"404": "no such bucket", "NoSuchBucket": "no such bucket",
                  "403": "access denied (check the credentials and the bucket's policy)"}.get(code, str(e))
        raise StorageError(f"{path}: bucket {bucket}{where}: {reason}") from e


def makedirs(path: str) -> None:
    _load_filesystem(path)
    if _as_directory(path) != str(path):
        return  # a bucket's root: there is nothing to make
    tf.io.gfile.makedirs(path)


def exists(path: str) -> bool:
    _load_filesystem(path)
    return tf.io.gfile.exists(_as_directory(path))


def isdir(path: str) -> bool:
    _load_filesystem(path)
    return tf.io.gfile.isdir(_as_directory(path))


def listdir(path: str) -> list:
    """Entry names, without the trailing "/" some filesystems add to directories."""
    _load_filesystem(path)
    return sorted(name.rstrip("/") for name in tf.io.gfile.listdir(_as_directory(path)))


def glob(pattern: str) -> list:
    """The paths matching `pattern`, sorted."""
    _load_filesystem(pattern)
    return sorted(tf.io.gfile.glob(pattern))


def read_text(path: str) -> str:
    _load_filesystem(path)
    with tf.io.gfile.GFile(path, "r") as f:
        return f.read()


def read_bytes(path: str) -> bytes:
    _load_filesystem(path)
    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read()


def write_text(path: str, text: str) -> str:
    """`write_bytes` of `text` in UTF-8."""
    return write_bytes(path, text.encode())


def write_bytes(path: str, data: bytes) -> str:
    """Writes `data` to `path` whole, making its folder: it is written beside `path` and
    renamed over it (atomic on local disk; on object stores a copy of one object, which
    appears at once), so no reader sees half of it. Returns `path`."""
    _load_filesystem(path)
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
    _load_filesystem(path)
    if tf.io.gfile.exists(path):
        tf.io.gfile.rmtree(path)


def files_under(root: str) -> list:
    """(path, path relative to `root` with "/" separators) of every file under `root`,
    sorted by the relative path."""
    _load_filesystem(root)
    root = root.rstrip("/")
    out = []
    for dirpath, _, filenames in tf.io.gfile.walk(_as_directory(root)):
        rel_dir = dirpath.rstrip("/")[len(root):].lstrip("/").replace(os.sep, "/")
        out += [(join(dirpath, name), f"{rel_dir}/{name}" if rel_dir else name) for name in filenames]
    if root.startswith("ram://"):
        # TF's ram:// lists by prefix, naming what is not there (the files of
        # `assets.extra/` under `assets/` as `.extra/...`): keep what exists. Elsewhere
        # that would cost a request per file for nothing.
        out = [item for item in out if tf.io.gfile.exists(item[0])]
    return sorted(out, key=lambda item: item[1])


def copy_tree(src: str, dst: str, last=()) -> None:
    """Copies the files under `src` to `dst`; files named in `last` after all others."""
    _load_filesystem(dst)
    files = files_under(src)
    for source, rel in sorted(files, key=lambda item: posixpath.basename(item[1]) in last):
        target = join(dst, *rel.split("/"))
        makedirs(parent(target))
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
    _load_filesystem(final)
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
            tf.io.gfile.rename(staging, final)  # one rename(2) on local disk: atomic
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
