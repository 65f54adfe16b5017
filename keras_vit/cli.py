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
    from keras_vit.pretrained import DownloadError
    from keras_vit.vit import load_model

    try:
        return load_model(path, image_size)
    except (FileNotFoundError, ValueError, TypeError, DownloadError) as e:  # CheckpointError: ValueError
        exit_for_bad_config(f"--model={path}: {e}")


def run_app(main) -> None:
    """`absl.app.run(main)`, with a StorageError (a bucket that is missing or out of
    reach, say) reported as a message and status 1, and the same exit status also
    where TensorFlow I/O's S3 client was used: its static destructors abort the interpreter's own exit (status
    134, "pure virtual method called"), so there the process ends itself
    (`storage.exit_now`) once `main` is done."""
    from absl import app

    def guarded(argv):
        from keras_vit.storage import StorageError

        try:
            return main(argv)
        except StorageError as e:  # a path the user gave: said plainly, not as a traceback
            sys.exit(f"{e}")

    try:
        app.run(guarded)
    except SystemExit as e:
        if not _s3_used():
            raise
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
        _exit_now(e.code if isinstance(e.code, int) else 0 if e.code is None else 1)
    except BaseException:
        if not _s3_used():
            raise
        import traceback

        traceback.print_exc()
        _exit_now(1)


def _s3_used() -> bool:
    storage = sys.modules.get("keras_vit.storage")  # never imported: never used
    return storage is not None and storage.s3_loaded()


def _exit_now(status: int) -> None:
    sys.modules["keras_vit.storage"].exit_now(status)
