"""One home for checking numbers from the user: command-line flags and config fields.

Flags: argparse ``type=`` converters made by ``integer(...)`` / ``number(...)``; argparse names the flag
in the error (``argument --batch-size: must be >= 1, got 0``) and ``ArgumentParser`` below prints it as one
line and exits 2, like every other input error of `vt`.

Config fields: annotate a dataclass field with its range, ``batch_size: Annotated[int, Range(ge=1)] = 64``,
and call ``check_fields(self)`` from ``__post_init__``. A violation raises ``FieldError``; when the
dataclass is built from a config file (``vt.config.to_dataclass``) the message names the dotted field,
``config.train.steps: must be >= 1, got 0``.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import sys
import typing
from pathlib import Path

from vt import VtError


class ArgumentParser(argparse.ArgumentParser):
    """Usage errors as one line on stderr (``vt sample: error: argument --n: ...``), exit code 2."""

    def error(self, message: str) -> typing.NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


@dataclasses.dataclass(frozen=True)
class Range:
    """Allowed values of a number: ge/le inclusive, gt/lt exclusive bounds; None = unbounded."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def problem(self, value) -> str | None:
        """Why ``value`` is out of range (None if it is in range)."""
        if isinstance(value, float) and not math.isfinite(value):
            return f"must be a finite number, got {value}"
        inside = ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                  and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))
        return None if inside else f"must be {self.describe()}, got {value}"

    def describe(self) -> str:
        parts = [f"{w} {_fmt(b)}" for b, w in ((self.ge, ">="), (self.gt, ">"), (self.le, "<="), (self.lt, "<"))
                 if b is not None]
        return " and ".join(parts) or "any number"


def _fmt(b: float) -> str:
    return str(int(b)) if float(b).is_integer() else str(b)


POSITIVE = Range(gt=0)
AT_LEAST_1 = Range(ge=1)
NON_NEGATIVE = Range(ge=0)
FRACTION = Range(ge=0, le=1)  # a share, probability or threshold in [0, 1]


def _converter(cast, kind: str, rng: Range):
    def convert(text: str):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None
        problem = rng.problem(value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    convert.__name__ = kind  # argparse shows it in its own messages
    convert.range = rng  # for tests that feed every flag a value outside its range
    return convert


def integer(ge: int | None = None, le: int | None = None, gt: int | None = None) -> typing.Callable[[str], int]:
    """argparse type: an integer in range."""
    return _converter(int, "an integer", Range(ge=ge, le=le, gt=gt))


def number(ge: float | None = None, le: float | None = None, gt: float | None = None,
           lt: float | None = None) -> typing.Callable[[str], float]:
    """argparse type: a finite float in range."""
    return _converter(float, "a number", Range(ge=ge, le=le, gt=gt, lt=lt))


def top_k(text: str) -> int:
    """argparse type for --top-k: -1 (off) or a positive integer."""
    value = integer(ge=-1)(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be -1 (off) or >= 1, got 0")
    return value


top_k.range = Range(ge=-1)
top_k.bad_values = ("0",)  # inside that range yet refused


def non_empty(text: str) -> str:
    """argparse type for a text flag whose empty value means nothing (a stop string that would match everywhere)."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return text


non_empty.bad_values = ("",)


positive_int = integer(ge=1)
non_negative_int = integer(ge=0)
positive_float = number(gt=0)
non_negative_float = number(ge=0)
fraction = number(ge=0, le=1)


class FieldError(VtError):
    """A config field out of range; ``to_dataclass`` re-raises it under the field's dotted name."""

    def __init__(self, owner: str, field: str, detail: str):
        self.owner, self.field, self.detail = owner, field, detail
        super().__init__(f"{owner}.{field}: {detail}")


@functools.lru_cache(maxsize=None)
def _ranges(cls) -> tuple[tuple[str, Range], ...]:
    hints = typing.get_type_hints(cls, include_extras=True)
    out = []
    for f in dataclasses.fields(cls):
        tp = hints.get(f.name)
        if typing.get_origin(tp) is typing.Annotated:
            out += [(f.name, m) for m in tp.__metadata__ if isinstance(m, Range)]
    return tuple(out)


def check_fields(obj) -> None:
    """Raise FieldError for the first field of dataclass ``obj`` outside its annotated Range; a tuple or list of
    numbers (``ks: Annotated[tuple[int, ...], AT_LEAST_1]``) is checked item by item, named ``field[i]``."""
    for name, rng in _ranges(type(obj)):
        value = getattr(obj, name)
        items = enumerate(value) if isinstance(value, (tuple, list)) else [(None, value)]
        for i, item in items:
            if item is None or isinstance(item, bool):
                continue
            problem = rng.problem(item)
            if problem:
                raise FieldError(type(obj).__name__, name if i is None else f"{name}[{i}]", problem)


def check_value(value, rng: Range, name: str) -> None:
    """VtError naming ``name`` (a flag, field or record key) when ``value`` is outside ``rng``."""
    problem = rng.problem(value)
    if problem:
        raise VtError(f"{name}: {problem}")


def refuse_same_file(input_path, output_path, input_name: str, output_name: str) -> None:
    """VtError when the output would replace the input (same path, or another name of the same file)."""
    inp, out = Path(input_path), Path(output_path)
    try:
        same = inp.resolve() == out.resolve() or (inp.exists() and out.exists() and os.path.samefile(inp, out))
    except OSError:
        same = False
    if same:
        raise VtError(f"{output_name} {output_path} is the input ({input_name}); writing it would destroy the "
                      "input: choose another output path")


def check_output_path(path, name: str, *, directory: bool = False) -> None:
    """VtError unless ``path`` can be written as a file (``directory=False``) or a directory: an existing path
    of the other kind, or an existing file among its parents, is named instead of surfacing later as
    IsADirectoryError / NotADirectoryError / FileExistsError."""
    path = Path(path)
    if path.exists():
        if directory and not path.is_dir():
            raise VtError(f"{name} {path}: exists and is not a directory")
        if not directory and path.is_dir():
            raise VtError(f"{name} {path}: is a directory; give a file path")
        return
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise VtError(f"{name} {path}: {parent} is a file, not a directory")
            return


class JsonError(ValueError):
    """A text that is not JSON as every other JSON reader reads it; the message says why, in a few words."""


def _refuse_constant(name: str):
    raise JsonError(f"bare {name} is not JSON; write null or a string")


def load_json(text: str):
    """``json.loads`` for input files: Python's ``NaN``, ``Infinity`` and ``-Infinity`` refused (no JSON parser
    elsewhere reads them, and a NaN reference or score passes every comparison as false), brackets nested too
    deeply for the reader a JsonError too (not a RecursionError). JsonError (a ValueError) says why."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as e:
        raise JsonError(f"{e.msg} at column {e.colno}") from None
    except RecursionError:
        raise JsonError("brackets nested too deeply to read") from None


def parse_json_line(raw: bytes | str, where: str):
    """One JSONL line -> its value, or VtError naming ``where``: not UTF-8, not JSON (``load_json``: bare NaN
    and too-deep nesting included), or text holding a lone surrogate (``"\\ud800"`` is valid JSON but not Unicode: it cannot be written back out as UTF-8)."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as e:
        raise VtError(f"{where}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})") from None
    try:
        value = load_json(text)
    except JsonError as e:
        raise VtError(f"{where}: invalid JSON ({e})") from None
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise VtError(f"{where}: text holds a lone surrogate ({e.object[e.start:e.end]!a}); not valid "
                      "Unicode") from None
    return value
