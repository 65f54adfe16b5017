"""Downloads checkpoint files once into a local cache, verified, safe to share between
processes, and usable offline.

Official files come from `KERAS_VIT_WEIGHTS_URL` (default the official bucket,
https://storage.googleapis.com/vit_models) + their path there; a mirror can be any
http(s) address or a `gs://`/`s3://` one read through tf.io.gfile. They are cached
under `$KERAS_VIT_HOME/weights/` (default `~/.cache/keras-vit/weights/`) by that same
path, so a change of mirror keeps the cache.

A download goes to a temporary name in the cache's folder and is renamed once it is
whole: its length must be what the server announced, and its MD5 and CRC32C what
Google Cloud Storage sends in `x-goog-hash` (when the server sends them). Two
processes that want the same file take turns on a lock file: the second finds it done.
`KERAS_VIT_OFFLINE=1` (or `HF_HUB_OFFLINE=1`) reads the cache only.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Optional

DEFAULT_BASE = "https://storage.googleapis.com/vit_models"
_CHUNK = 1 << 20
_TIMEOUT_S = 60


class DownloadError(OSError):
    """A file that could not be fetched whole: the URL and what went wrong."""


def offline() -> bool:
    """Whether downloads are off (`KERAS_VIT_OFFLINE` or `HF_HUB_OFFLINE` set to 1/true/yes)."""
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("KERAS_VIT_OFFLINE", "HF_HUB_OFFLINE"))


def cache_dir() -> str:
    """Where downloaded weights live: `$KERAS_VIT_HOME/weights` (default ~/.cache/keras-vit/weights)."""
    home = os.environ.get("KERAS_VIT_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "keras-vit")
    if "://" in home:  # the lock and the rename need a local filesystem
        raise DownloadError(f"KERAS_VIT_HOME={home}: the weights cache must be a local folder "
                            "(put a mirror of the files in a bucket with KERAS_VIT_WEIGHTS_URL instead)")
    return os.path.join(home, "weights")


def official_url(path: str) -> str:
    """The address of `path` (e.g. `augreg/....npz`) under `KERAS_VIT_WEIGHTS_URL`."""
    base = os.environ.get("KERAS_VIT_WEIGHTS_URL") or DEFAULT_BASE
    return base.rstrip("/") + "/" + path.lstrip("/")


def fetch_official(path: str, progress: bool = True) -> str:
    """The local path of the official file `path`, downloaded first if it is not cached."""
    return fetch(official_url(path), os.path.join(cache_dir(), *path.split("/")), progress=progress)


def fetch(url: str, target: str, progress: bool = True) -> str:
    """Makes `target` (a local file) hold `url`'s content; returns `target`.

    Raises:
      DownloadError: offline and not cached, the server refused, or what arrived is
        not what the server announced (length, MD5, CRC32C). Nothing is left under
        `target` then.
    """
    if os.path.exists(target):
        return target
    if offline():
        raise DownloadError(
            f"{url} is not in the cache and downloads are off (KERAS_VIT_OFFLINE or HF_HUB_OFFLINE). "
            f"Fetch it on a machine with access and put it at {target}")
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be fetching it: wait for it
        if os.path.exists(target):
            return target
        partial = f"{target}.partial-{os.getpid()}"
        try:
            _download(url, partial, progress)
            os.replace(partial, target)
        finally:
            if os.path.exists(partial):
                os.remove(partial)
    if progress:
        print(f"Saved {url} to {target}", file=sys.stderr, flush=True)
    return target


def _download(url: str, out_path: str, progress: bool) -> None:
    if url.startswith(("http://", "https://")):
        try:
            response = urllib.request.urlopen(urllib.request.Request(url), timeout=_TIMEOUT_S)
        except urllib.error.HTTPError as e:
            raise DownloadError(f"{url}: the server answered {e.code} {e.reason}") from e
        except (urllib.error.URLError, OSError) as e:
            raise DownloadError(f"{url}: cannot connect ({getattr(e, 'reason', e)})") from e
        with response:
            length = response.headers.get("Content-Length")
            hashes = _goog_hashes(response.headers.get_all("x-goog-hash") or [])
            _copy(response, url, out_path, int(length) if length else None, hashes, progress)
        return
    import tensorflow as tf  # a gs:// or s3:// mirror

    from keras_vit import storage

    try:
        storage.check(url)
        size = tf.io.gfile.stat(url).length
        with tf.io.gfile.GFile(url, "rb") as f:
            _copy(f, url, out_path, size, {}, progress)
    except (tf.errors.OpError, storage.StorageError) as e:
        raise DownloadError(f"{url}: {e}") from e


def _goog_hashes(values) -> dict:
    # "x-goog-hash: crc32c=n03x6A==, md5=Ojk9c3dhfxgoKVVHYwFbHQ==" (one header or several).
    out = {}
    for value in values:
        for part in value.split(","):
            if "=" in part:
                kind, digest = part.strip().split("=", 1)
                out[kind.lower()] = base64.b64decode(digest)
    return out


class _Crc32c:
    # google-crc32c where it is installed (it comes with Google Cloud's clients).
    def __init__(self):
        import google_crc32c

        self._c = google_crc32c.Checksum()

    def update(self, data):
        self._c.update(data)

    def digest(self):
        return self._c.digest()


def _checkers(hashes: dict) -> dict:
    checkers = {}
    if "md5" in hashes:
        checkers["md5"] = hashlib.md5()
    if "crc32c" in hashes:
        try:
            checkers["crc32c"] = _Crc32c()
        except ImportError:
            pass  # the length and MD5 still hold it
    return checkers


def _copy(src, url: str, out_path: str, size: Optional[int], hashes: dict, progress: bool) -> None:
    checkers = _checkers(hashes)
    bar = _Progress(url, size) if progress else None
    done = 0
    with open(out_path, "wb") as out:
        while True:
            try:
                chunk = src.read(_CHUNK)
            except Exception as e:  # a connection cut mid-body (http.client.IncompleteRead, ...)
                raise DownloadError(f"{url}: the transfer broke off after {done:,} bytes ({e})") from e
            if not chunk:
                break
            out.write(chunk)
            for checker in checkers.values():
                checker.update(chunk)
            done += len(chunk)
            if bar:
                bar.update(done)
    if bar:
        bar.close(done)
    if size is not None and done != size:
        raise DownloadError(f"{url}: got {done:,} bytes where the server announced {size:,}")
    for kind, checker in checkers.items():
        if checker.digest() != hashes[kind]:
            raise DownloadError(f"{url}: its {kind.upper()} does not match the server's x-goog-hash "
                                "(the file arrived corrupted)")


class _Progress:
    """One line on stderr: done / total MiB and the rate; redrawn in place on a terminal,
    every tenth elsewhere (logs)."""

    def __init__(self, url: str, size: Optional[int]):
        self.url, self.size, self.start = url, size, time.time()
        self.tty = sys.stderr.isatty()
        self.last_draw, self.last_tenth = 0.0, -1
        print(f"Downloading {url}" + (f" ({size / 2**20:,.1f} MiB)" if size else ""), file=sys.stderr,
              flush=True)

    def _line(self, done: int) -> str:
        rate = done / max(time.time() - self.start, 1e-6) / 2**20
        total = f" / {self.size / 2**20:,.1f}" if self.size else ""
        return f"  {done / 2**20:,.1f}{total} MiB, {rate:,.1f} MiB/s"

    def update(self, done: int) -> None:
        now = time.time()
        if self.tty and now - self.last_draw > 0.25:
            print("\r" + self._line(done), end="", file=sys.stderr, flush=True)
            self.last_draw = now
        elif not self.tty and self.size:
            tenth = 10 * done // self.size
            if tenth > self.last_tenth:
                self.last_tenth = tenth
                print(self._line(done), file=sys.stderr, flush=True)

    def close(self, done: int) -> None:
        if self.tty:
            print("\r" + self._line(done), file=sys.stderr, flush=True)
