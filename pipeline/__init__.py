"""The TFX pipeline from image data to a servable model, and the pieces it is built from.

- `definition`: the pipeline's components and wiring; `run`: the runner and CLI.
- `ingest`: sources to tf.Example records; `components`: the custom components.
- `dedup` (in memory) and `dedup_beam` (Beam): training images that copy evaluation
  images, as the paper de-duplicates; `report`: what Dedup writes for review.
- `trainer_module`: the Trainer's `run_fn`.
"""
