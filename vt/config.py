"""Config files and the typed boundary.

A config file is a Python module with `get_config(arg: str | None) -> ml_collections.ConfigDict`;
`configs/sft_stage1.py:smoke` calls `get_config("smoke")`. Command-line overrides `--config.optim.lr=1e-5`
change one field, with the value parsed as a Python literal and checked against the field's type.

A config file inside a package (a directory with `__init__.py`, like `configs/`) is imported as a member of
that package, so it builds on its siblings with ordinary imports (`from configs import mgpo_math`) and shares
helpers (`configs/common.py`); a file anywhere else is executed on its own.

Library code never sees a ConfigDict: `to_dataclass(Cls, cd)` converts it, at the boundary, into frozen
dataclasses, rejecting unknown and missing fields by their dotted name.
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import importlib.util
import sys
import types
import typing
from pathlib import Path
from typing import Any, Sequence

import ml_collections

from vt import VtError
from vt.validation import FieldError


def load_config(spec: str, overrides: Sequence[str] = ()):
    """Load `path.py[:variant]` and apply `--config.a.b=value` overrides."""
    path_str, _, variant = spec.partition(":")
    path = Path(path_str)
    module = import_config_module(path)
    if not hasattr(module, "get_config"):
        raise VtError(f"{path}: defines no get_config(arg)")
    try:
        cd = module.get_config(variant or None)
    except (KeyError, ValueError) as e:
        raise VtError(f"{path}: variant {variant!r}: {e}") from None
    if not isinstance(cd, ml_collections.ConfigDict):
        raise VtError(f"{path}: get_config must return an ml_collections.ConfigDict")
    for item in overrides:
        apply_override(cd, item)
    return cd


def import_config_module(path: Path):
    """The config file's module: a member of its package when it lives in one (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise VtError(f"{path}: config file not found")
    try:
        if (path.parent / "__init__.py").is_file() and path.parent.name.isidentifier():
            return _import_package_member(path)
        module_spec = importlib.util.spec_from_file_location(f"vt_config_{path.stem}", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    except VtError:
        raise
    except Exception as e:
        raise VtError(f"{path}: cannot import config ({type(e).__name__}: {e})") from None
    return module


def _import_package_member(path: Path):
    package_dir = path.parent.resolve()
    root = str(package_dir.parent)
    if root not in sys.path:
        sys.path.append(root)
    module = importlib.import_module(f"{package_dir.name}.{path.stem}")
    if Path(module.__file__).resolve() != path.resolve():  # another directory of that name came first
        raise VtError(f"{path}: importing it as {module.__name__} found {module.__file__} instead")
    return module


def apply_override(cd, item: str) -> None:
    if not item.startswith("--config."):
        raise VtError(f"unrecognized argument {item!r} (overrides look like --config.key=value)")
    key, eq, raw = item[len("--config."):].partition("=")
    if not eq:
        raise VtError(f"override {item!r}: expected --config.{key}=VALUE")
    parent, leaf = cd, key.split(".")
    for part in leaf[:-1]:
        if part not in parent:
            raise VtError(f"override --config.{key}: no field '{part}' in config")
        parent = parent[part]
    name = leaf[-1]
    if name not in parent:
        raise VtError(f"override --config.{key}: no such field (known: {sorted(parent.keys())})")
    old = parent[name]
    value = _parse_value(raw, old, key)
    with parent.unlocked() if hasattr(parent, "unlocked") else contextlib.nullcontext():
        parent[name] = value


def _parse_value(raw: str, old: Any, key: str) -> Any:
    if isinstance(old, str) or old is None and not _looks_literal(raw):
        return raw
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        raise VtError(f"override --config.{key}={raw}: not a valid value for a {type(old).__name__} field") from None
    if old is None:
        return value
    if isinstance(old, bool) != isinstance(value, bool):
        raise VtError(f"override --config.{key}={raw}: expected {type(old).__name__}")
    if isinstance(old, float) and isinstance(value, int):
        return float(value)
    if isinstance(old, (tuple, list)) and isinstance(value, (tuple, list)):
        return type(old)(value)
    if not isinstance(value, type(old)):
        raise VtError(f"override --config.{key}={raw}: expected {type(old).__name__}, got {type(value).__name__}")
    return value


def _looks_literal(raw: str) -> bool:
    try:
        ast.literal_eval(raw)
        return True
    except (ValueError, SyntaxError):
        return False


def to_dataclass(cls, cd, where: str = "config"):
    """Build dataclass `cls` from a ConfigDict / dict, recursively, by field name and annotated type."""
    data = cd.to_dict() if hasattr(cd, "to_dict") else dict(cd)
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise VtError(f"{where}: unknown field(s) {', '.join(f'{where}.{u}' for u in unknown)}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise VtError(f"{where}: missing field {where}.{f.name}")
            continue
        kwargs[f.name] = _coerce(hints[f.name], data[f.name], f"{where}.{f.name}")
    try:
        return cls(**kwargs)
    except FieldError as e:  # a range check in __post_init__: name the field as the config spells it
        raise VtError(f"{where}.{e.field}: {e.detail}") from None


def _coerce(tp, value, where):
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):  # typed already (a recipe stage's learner config, named as its section spells it)
            return value
        if not isinstance(value, dict) and not hasattr(value, "to_dict"):
            raise VtError(f"{where}: expected a group of fields, got {value!r}")
        return to_dataclass(tp, value, where)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(a, value, where)
            except VtError as e:
                errors.append(str(e))
        raise VtError(errors[0] if errors else f"{where}: bad value {value!r}")
    if origin in (tuple, list):
        if not isinstance(value, (tuple, list)):
            raise VtError(f"{where}: expected a list, got {value!r}")
        args = typing.get_args(tp)
        item_tp = args[0] if args else Any
        return origin(_coerce(item_tp, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict or tp is Any or origin is typing.Literal:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(tp, type) and not isinstance(value, tp):
        raise VtError(f"{where}: expected {tp.__name__}, got {type(value).__name__} {value!r}")
    return value
