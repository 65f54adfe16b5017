"""What the command-line tools share: a JSON flag check, how a bad config is reported, model loading."""

from __future__ import annotations

import json
import sys

from absl import flags


def register_json_object_flag(name: str) -> None:
    """Makes absl refuse flag `name` at parse time unless it holds a JSON object."""

    def check(text):
        try:
            value = json.loads(text or "{}")
        except json.JSONDecodeError as e:
            raise flags.ValidationError(f"not valid JSON ({e}): {text}")
        if not isinstance(value, dict):
            raise flags.ValidationError(f"must be a JSON object of config fields, got {text}")
        return True

    flags.register_validator(name, check)


def register_shots_flag(name: str) -> None:
    """Makes absl refuse list flag `name` unless it holds positive whole numbers."""

    def check(values):
        try:
            return bool(values) and all(int(v) >= 1 for v in values)
        except ValueError:
            return False

    flags.register_validator(name, check, message="must be a list of positive whole numbers")


def exit_for_bad_config(message: str) -> None:
    """Exits with status 1 as absl does for a bad flag, without its full usage text."""
    sys.exit(f"{message}\nPass --helpshort or --helpfull to see help on flags.")


def load_model_or_exit(path: str, image_size=None):
    """`keras_vit.load_model`, with a missing or unreadable model file reported as a bad
    `--model` flag rather than a traceback."""
    from keras_vit.vit import load_model

    try:
        return load_model(path, image_size)
    except (FileNotFoundError, ValueError, TypeError) as e:  # CheckpointError is a ValueError
        exit_for_bad_config(f"--model={path}: {e}")
