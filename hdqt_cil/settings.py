"""Settings as dataclass fields that carry their rule: the one place where a config value's type, default and
allowed values are written (Hydra enforces the types when composing; `check_settings` the rules, once a run).
"""
import copy
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Rule:
    """What a setting allows: a test and its wording for error messages ("must be <allowed>")."""
    test: Callable[[Any], bool]
    allowed: str


def setting(default, rule: Rule | None = None):
    """A dataclass field with a default (a mutable one is copied for each instance) and a Rule."""
    metadata = {"rule": rule} if rule else {}
    if isinstance(default, (list, dict)) or is_dataclass(default):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def rule_of(cls: type, name: str) -> Rule | None:
    """The Rule of setting `name`: its own, or the one of the class it extends (a subclass that only changes a
    default keeps its base's rule)."""
    for base in cls.__mro__:
        found = getattr(base, "__dataclass_fields__", {}).get(name)
        if found is not None and "rule" in found.metadata:
            return found.metadata["rule"]
    return None


def check_settings(obj, path: str = "") -> None:
    """Every Rule of the dataclass `obj`, then of the dataclasses it holds, then their `check(path)` for rules
    across settings; the first failure raises ValueError naming `path.key=value` and what is allowed. An object's
    own settings come before its sections', so a bad `seed=-1` is named as such, not as the `quant.seed` that
    follows it."""
    for f in fields(obj):
        value, rule = getattr(obj, f.name), rule_of(type(obj), f.name)
        if rule is not None and not rule.test(value):
            raise ValueError(f"{path}{f.name}={value!r} must be {rule.allowed}")
    for f in fields(obj):
        section = getattr(obj, f.name)
        if is_dataclass(section):
            check_settings(section, f"{path}{f.name}.")
    if hasattr(obj, "check"):
        obj.check(path)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def one_of(*choices) -> Rule:
    return Rule(lambda v: v in choices, "one of " + ", ".join(map(str, choices)))


def optional(rule: Rule) -> Rule:
    return Rule(lambda v: v is None or rule.test(v), f"{rule.allowed} or null")


BOOL = Rule(lambda v: isinstance(v, bool), "true or false")
POSITIVE_INT = Rule(lambda v: _is_int(v) and v > 0, "a positive integer")
NON_NEGATIVE_INT = Rule(lambda v: _is_int(v) and v >= 0, "a non-negative integer")
POSITIVE = Rule(lambda v: _is_number(v) and v > 0, "a positive number")
NON_NEGATIVE = Rule(lambda v: _is_number(v) and v >= 0, "a non-negative number")
FRACTION = Rule(lambda v: _is_number(v) and 0 < v < 1, "a number strictly between 0 and 1")
INT_LIST = Rule(lambda v: isinstance(v, list) and all(map(_is_int, v)), "a list of integers")
