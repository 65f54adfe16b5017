"""Imported by each Beam worker before it runs any of the job (`--beam_plugin`, which
`pipeline.run.beam_args` adds when the pipeline's data is on s3://).

TensorFlow code on a worker reads s3:// only once TensorFlow I/O is loaded: the
Evaluator's TFMA loads the trained model from the pipeline root with TensorFlow alone.
"""

from keras_vit import storage

storage.load_s3()
