"""What the command-line tools share: flags made from a config dataclass, a JSON flag
check, how a bad config is reported, model loading."""

from __future__ import annotations

import dataclasses
import json
import sys
import typing

from absl import flags


def register_json_object_flag(name: str, flag_values=flags.FLAGS) -> None:
    """Makes absl refuse flag `name` at parse time unless it holds a JSON object."""

    def check(text):
        try:
            value = json.loads(text or "{}")
        except json.JSONDecodeError as e:
            raise flags.ValidationError(f"not valid JSON ({e}): {text}")
        if not isinstance(value, dict):
            raise flags.ValidationError(f"must be a JSON object of config fields, got {text}")
        return True

    flags.register_validator(name, check, flag_values=flag_values)


def register_shots_flag(name: str, flag_values=flags.FLAGS) -> None:
    """Makes absl refuse list flag `name` unless it holds positive whole numbers."""

    def check(values):
        try:
            return bool(values) and all(int(v) >= 1 for v in values)
        except ValueError:
            return False

    flags.register_validator(name, check, message="must be a list of positive whole numbers",
                             flag_values=flag_values)


def define_config_flags(config_cls, flag_values=flags.FLAGS) -> None:
    """Defines one absl flag per field of dataclass `config_cls` whose metadata has a
    `help` (see `keras_vit.training.run._flag`): its type from the annotation (str,
    int, float, bool, a JSON-object dict, a tuple of positive ints as a list), its
    choices as an enum, named `flag` if given, defaulting to `flag_default` if given
    and else to the field's own default."""
    hints = typing.get_type_hints(config_cls)
    for field in _flag_fields(config_cls):
        meta, name = field.metadata, field.metadata.get("flag", field.name)
        default = meta["flag_default"] if "flag_default" in meta else (
            field.default_factory() if field.default is dataclasses.MISSING else field.default)
        kind, text = _value_type(hints[field.name]), meta["help"]
        if "choices" in meta:
            flags.DEFINE_enum(name, default, list(meta["choices"]), text, flag_values=flag_values)
        elif kind is bool:
            flags.DEFINE_bool(name, default, text, flag_values=flag_values)
        elif kind is int:
            flags.DEFINE_integer(name, default, text, flag_values=flag_values)
        elif kind is float:
            flags.DEFINE_float(name, default, text, flag_values=flag_values)
        elif kind is str:
            flags.DEFINE_string(name, default, text, flag_values=flag_values)
        elif kind is dict:
            flags.DEFINE_string(name, json.dumps(default), text, flag_values=flag_values)
            register_json_object_flag(name, flag_values)
        elif kind is tuple:
            flags.DEFINE_list(name, [str(v) for v in default], text, flag_values=flag_values)
            register_shots_flag(name, flag_values)
        else:
            raise TypeError(f"{config_cls.__name__}.{field.name}: no flag for type {hints[field.name]}")


def config_from_flags(config_cls, flag_values=flags.FLAGS, **given):
    """`config_cls` from the parsed flags `define_config_flags` made, with `given`
    fields taking precedence (and fields without a flag at their defaults)."""
    hints = typing.get_type_hints(config_cls)
    values = {}
    for field in _flag_fields(config_cls):
        if field.name in given:
            continue
        value = flag_values[field.metadata.get("flag", field.name)].value
        kind = _value_type(hints[field.name])
        if kind is dict:
            value = json.loads(value or "{}")
        elif kind is tuple:
            value = tuple(int(v) for v in value)
        values[field.name] = value
    return config_cls(**values, **given)


def _flag_fields(config_cls):
    return [f for f in dataclasses.fields(config_cls) if f.metadata.get("help")]


def _value_type(hint):
    """The type a flag holds for annotation `hint`: `Optional[X]` is X, `Tuple[int, ...]` tuple."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Union and len(args) == 1:
        hint = args[0]
    return typing.get_origin(hint) or hint


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
