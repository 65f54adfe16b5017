"""One CSV row per epoch of `fit`, at any path tf.io.gfile writes (local or a bucket)."""

from __future__ import annotations

import keras

from keras_vit import storage


class CSVHistory(keras.callbacks.Callback):
    """Keras's `CSVLogger(path, append=True)` for local and object-store paths alike.

    CSVLogger keeps the file open and appends to it, which object stores cannot do
    (and Keras's own remote file lacks the `closed` it checks). Here the rows are kept
    and the whole file is written again after each epoch, at once: a run's history is
    a row per checkpoint chunk, a few kilobytes. A resumed run keeps the rows and
    columns already there.

    Columns: `epoch`, then the logs' keys sorted; if the first epoch has no validation
    metrics, a `val_` column for each key as well (filled with NA until there are).
    """

    def __init__(self, path: str):
        super().__init__()
        self.path = path
        self.lines, self.keys = [], None

    def on_train_begin(self, logs=None):
        self.lines = storage.read_text(self.path).splitlines() if storage.exists(self.path) else []
        self.keys = self.lines[0].split(",")[1:] if self.lines else None

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        if self.keys is None:
            self.keys = sorted(logs)
            if not any(k.startswith("val_") for k in self.keys):
                self.keys += [f"val_{k}" for k in self.keys]
            self.lines.append(",".join(["epoch", *self.keys]))
        self.lines.append(",".join([str(epoch), *(_cell(logs.get(k, "NA")) for k in self.keys)]))
        storage.write_text(self.path, "\n".join(self.lines) + "\n")


def _cell(value) -> str:
    if isinstance(value, str):
        return value
    try:
        return str(float(value))
    except TypeError:  # a list of values, quoted as CSVLogger does
        return '"[' + ", ".join(map(str, value)) + ']"'
