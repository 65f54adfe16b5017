"""tf.distribute strategies by name, and the Keras multi-worker fix they need.

Keras 3's `model.fit` fails under MultiWorkerMirroredStrategy on the TensorFlow
backend (https://github.com/keras-team/keras/issues/20585,
https://github.com/tensorflow/tensorflow/issues/72388). Two places in
`keras/src/backend/tensorflow/trainer.py` are at fault:
  - `_maybe_symbolic_build` mean-reduces the first data batch across workers
    (a collective the workers do not all enter in step) just to learn shapes;
    the local replica's batch has the same shapes.
  - `reduce_per_replica` mean-reduces scalar metrics with `axis=0`, which fails
    on rank-0 values; `axis=None` is the mean across replicas.
`patch_keras_multi_worker` replaces both on the Keras versions whose two functions it
was checked against: 3.12 to 3.15 (the same code in 3.12.4, 3.13.2, 3.14.1 and 3.15.1).
On any other it changes nothing and says so. Remove it when upstream is fixed:
tests/test_training.py trains two workers for real, and a strict xfail there runs them
without the fix.
"""

from __future__ import annotations

import json
import os

import keras
import tensorflow as tf
from absl import logging

STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker", "tpu")
_FIXED_KERAS = ((3, 12), (3, 15))  # first and last minor version, inclusive
_patched = False


def _keras_minor(version: str) -> tuple:
    return tuple(int(part) for part in version.split(".")[:2])


def patch_keras_multi_worker() -> bool:
    """Applies the two fixes above; returns whether they are active."""
    global _patched
    if _patched:
        return True
    first, last = _FIXED_KERAS
    if not first <= _keras_minor(keras.__version__) <= last:
        logging.warning("keras %s is not one of %d.%d to %d.%d: the multi-worker fix is not applied; if "
                        "model.fit fails under MultiWorkerMirroredStrategy see keras-team/keras#20585",
                        keras.__version__, *first, *last)
        return False
    from keras.src import tree
    from keras.src.backend.tensorflow import trainer as tf_trainer

    original_reduce = tf_trainer.reduce_per_replica

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if self._distribute_strategy is None:
            return
        if iterator is not None:
            for _, _, it in iterator:
                batch = next(it)
                # Shapes are all the build needs: the local replica's batch has them.
                data_batch = tree.map_structure(
                    lambda x: self.distribute_strategy.experimental_local_results(x)[0]
                    if isinstance(x, tf.distribute.DistributedValues) else x, batch)
                break
        with self.distribute_strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    def reduce_per_replica(values, strategy, reduction):
        if tf_trainer._collective_all_reduce_multi_worker(strategy) and reduction in ("auto", "mean"):
            def _mean(v):
                rank = strategy.experimental_local_results(v)[0].shape.rank
                return strategy.reduce("MEAN", v, axis=None if rank == 0 else 0)
            return tree.map_structure(_mean, values)
        return original_reduce(values, strategy, reduction)

    tf_trainer.TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build
    tf_trainer.reduce_per_replica = reduce_per_replica
    _patched = True
    return True


def make_strategy(name: str = "auto", tpu: str = None, tpu_zone: str = None, tpu_project: str = None):
    """A tf.distribute strategy by name.

    - auto: MirroredStrategy over all GPUs when there are several, else the default.
    - one_device: the first GPU, or the CPU.
    - mirrored: MirroredStrategy over the local GPUs (or the CPU).
    - multi_worker: MultiWorkerMirroredStrategy; the cluster comes from TF_CONFIG.
    - tpu: TPUStrategy; `tpu` is the TPU name or grpc:// address ('' or 'local' on a
      TPU VM), with `tpu_zone` and `tpu_project` for Cloud TPUs.
    """
    if name not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {name!r}")
    if name == "multi_worker":
        # Before anything that initialises the TF context: collectives are set up at startup.
        if "TF_CONFIG" in os.environ:
            cluster = json.loads(os.environ["TF_CONFIG"]).get("cluster", {})
            logging.info("multi-worker cluster: %s", cluster)
        patch_keras_multi_worker()
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_logical_devices("GPU")
    if name == "auto":
        return tf.distribute.MirroredStrategy() if len(gpus) > 1 else tf.distribute.get_strategy()
    if name == "one_device":
        return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else "/cpu:0")
    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
        tpu="" if tpu in (None, "local") else tpu, zone=tpu_zone, project=tpu_project)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)
