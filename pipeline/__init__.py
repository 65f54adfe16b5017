"""The TFX pipeline from image data to a servable model, and the pieces it is built from.

`pipeline.dedup` finds training images that copy evaluation images (the paper's
de-duplication); it serves as a plain Python API and as the pipeline's Dedup step.
"""
