"""The one error type of the checkpoint loaders."""


class CheckpointError(ValueError):
    """A checkpoint is unreadable, or does not fit the model (a tensor missing, extra or mis-shaped)."""
