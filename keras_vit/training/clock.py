"""A run's training time across restarts, kept beside its checkpoints."""

from __future__ import annotations

import json
import time

import keras

from keras_vit import storage


class TrainingClock(keras.callbacks.Callback):
    """Seconds of `fit` over every process that trained a run, stopped and resumed.

    After each chunk (Keras epoch) the seconds so far are written to
    `<backup_dir>/train_seconds.json`, after the chunk's checkpoint, so a resumed run
    starts its clock from the time its checkpoint had cost; a run started afresh starts
    from 0 whatever the file holds.

    Args:
      backup_dir: the run's checkpoint directory (local or a bucket).
      resumed: whether this process resumes the run from a checkpoint there.
    """

    def __init__(self, backup_dir: str, resumed: bool):
        super().__init__()
        self.path = storage.join(backup_dir, "train_seconds.json")
        self.before = 0.0
        if resumed and storage.exists(self.path):
            self.before = float(json.loads(storage.read_text(self.path))["seconds"])
        self.start = None

    @property
    def seconds(self) -> float:
        """Training seconds so far, this process's and those before the restart."""
        return self.before + (time.time() - self.start if self.start is not None else 0.0)

    def on_train_begin(self, logs=None):
        self.start = time.time()

    def on_epoch_end(self, epoch, logs=None):
        storage.write_text(self.path, json.dumps({"chunk": epoch + 1, "seconds": round(self.seconds, 1)}))
