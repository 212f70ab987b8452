"""Rule files: rules written in TOML, loaded with tomllib, checked key by key.

    [[rule]]
    name = "fuse-gpu-chains"
    priority = 10
    when = "count('gpu') > 0"
    match = { op = "forall", chain = 2, device_kinds = ["gpu"] }
    then = [ { action = "fuse" } ]

    [[rule]]
    name = "gpu-busy"
    when = "gpu.utilization > 0.5"
    match = { op = "forall" }
    then = [ { action = "partition", shares = { cpu = "gpu.utilization", gpu = "1 - gpu.utilization" } } ]

Rule keys: ``name`` (required), ``when`` (a rule expression, see
:mod:`hetflow.ir.expressions`; default True), ``match``, ``then`` (required: a list of
action tables), ``priority``, ``enabled``, ``description``. Match keys: ``op``,
``kernel`` (a name or a non-empty list), ``chain`` (minimum length of a producer-consumer
chain), ``max_chain``, ``same_extent``, ``dtype`` (a NumPy dtype name), ``min_size``,
``max_size`` (finite numbers >= 0, ``max_size`` not below ``min_size``), ``device_kinds``,
``place``. Actions and their keys:

- ``fuse``
- ``split``: ``pieces`` (1 to :data:`~hetflow.ir.actions.MAX_PIECES`, or an
  expression), ``place`` (bool)
- ``substitute``: ``map`` (kernel or op name -> hetflow.library name or a name in the
  ``kernels`` given to the loader; another name is an error when the file loads)
- ``partition``: ``shares`` (device id or kind -> a finite number >= 0 or an
  expression), ``kinds``
- ``compile``: ``kinds``
- ``set``: ``var``, ``value`` (a finite number, a boolean or an expression; a string value
  is written as an expression string literal: ``value = "'fast'"``)
- ``add_rule``: ``rule`` (a rule table); ``remove_rule``: ``name``;
  ``change_rule``: ``name`` and any of ``priority``, ``enabled``, ``when``

Every error is a RuleSyntaxError naming the file, the rule and the key
(``rules.toml: rule 'gpu-busy', key 'then[0].shares.gpu': ...``; also in the error's
``rule`` and ``key`` attributes), and for an expression the column inside it. TOML's
own errors name the line and column where tomllib found them. Loading takes time
linear in the number of rules.
"""
from __future__ import annotations

import contextlib
import gc
import math
import os
import re
import sys
import tomllib
from pathlib import Path

import numpy as np

from .. import library
from ..errors import RuleError, RuleSyntaxError
from . import actions as A
from .expressions import MAX_INT_BITS, Expr, Where, finite, parse
from .patterns import Chain, NodePattern
from .rules import Rule

RULE_KEYS = {"name", "when", "match", "then", "priority", "enabled", "description"}
MATCH_KEYS = {"op", "kernel", "chain", "max_chain", "same_extent", "dtype", "min_size", "max_size",
              "device_kinds", "place"}
ACTION_KEYS = {
    "fuse": set(),
    "split": {"pieces", "place"},
    "substitute": {"map"},
    "partition": {"shares", "kinds"},
    "compile": {"kinds"},
    "set": {"var", "value"},
    "add_rule": {"rule"},
    "remove_rule": {"name"},
    "change_rule": {"name", "priority", "enabled", "when"},
}


class _At:
    """Where a value sits in a rule file: the file, the rule (by name) and the key path."""

    __slots__ = ("filename", "kernels", "key", "rule")

    def __init__(self, filename: str, rule: str | int | None, key: str, kernels: dict):
        # rule: its name, or its number in the file (1-based) until its name is known
        self.filename, self.rule, self.key, self.kernels = filename, rule, key, kernels

    def __truediv__(self, key) -> _At:
        """The place of ``key`` (a name, or an index in a list) under this one."""
        step = f"[{key}]" if isinstance(key, int) else (f".{key}" if self.key else key)
        return _At(self.filename, self.rule, self.key + step, self.kernels)

    def named(self, rule: str | int) -> _At:
        return _At(self.filename, rule, self.key, self.kernels)

    def error(self, msg: str) -> RuleSyntaxError:
        place = self.filename
        if self.rule is not None:
            place += f": rule {self.rule!r}" if isinstance(self.rule, str) else f": rule #{self.rule}"
        if self.key:
            place += f", key {self.key!r}"
        err = RuleSyntaxError(f"{place}: {msg}", (self.filename, None, None, None))
        err.rule, err.key = self.rule, self.key or None
        return err

    def where(self) -> Where:
        return Where(self.filename, self.rule, self.key)


def load(path, kernels: dict | None = None) -> list[Rule]:
    """The rules of a TOML rule file (UTF-8, as TOML is, with or without a byte-order
    mark); RuleSyntaxError naming the file, the rule and the key."""
    return loads(read(path), str(path), kernels)


def read(path) -> str:
    """The text of rule file ``path``, without the byte-order mark that Windows editors
    put before UTF-8; RuleError where it cannot be read, RuleSyntaxError naming the line
    and column where it is not UTF-8."""
    if not isinstance(path, (str, os.PathLike)):
        raise RuleError(f"a rule file is named by a path (str or os.PathLike), not {type(path).__name__}")
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")   # tomllib refuses a byte-order mark
    except OSError as exc:
        raise RuleError(f"cannot read rule file {path}: {exc}") from exc
    except UnicodeDecodeError as exc:  # TOML is UTF-8: say where it is not
        before = exc.object[:exc.start]
        line, col = before.count(b"\n") + 1, exc.start - before.rfind(b"\n")
        raise RuleSyntaxError(f"{path}:{line}:{col}: the rule file is not UTF-8 (byte "
                              f"0x{exc.object[exc.start]:02x})", (str(path), line, col, None)) from None
    return text


def loads(text: str, filename: str = "<rules>", kernels: dict | None = None) -> list[Rule]:
    """The rules of TOML text (``filename`` is used in error messages)."""
    with _collector_paused():
        return _loads(text, filename, kernels)


@contextlib.contextmanager
def _collector_paused():
    """Loading makes many objects that all stay alive: the cyclic garbage collector's
    passes over them free nothing, and took 40% of loading 10,000 rules."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _loads(text: str, filename: str, kernels: dict | None) -> list[Rule]:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _toml_error(exc, text, filename) from None
    except ValueError as exc:  # an integer with more digits than Python converts
        raise _long_integer(exc, text, filename) from None
    except RecursionError:  # tomllib parses nested tables recursively
        raise RuleSyntaxError(f"{filename}: tables nested too deeply", (filename, None, None, None)) from None
    top = _At(filename, None, "", kernels or {})
    for key in doc:
        if key != "rule":
            raise top.error(f"unknown top-level key {key!r} (a rule file has [[rule]] tables)")
    specs = doc.get("rule", [])
    if not isinstance(specs, list):
        raise top.error("'rule' must be an array of tables: write [[rule]]")
    rules, names = [], set()
    for index, spec in enumerate(specs):
        try:
            rule = _rule(spec, top.named(index + 1))
        except RecursionError:  # rules adding rules adding rules...
            raise top.named(index + 1).error("rules added by rules nested too deeply") from None
        if rule.name in names:
            raise top.named(index + 1).error(f"duplicate rule name {rule.name!r}")
        names.add(rule.name)
        rules.append(rule)
    return rules


def _toml_error(exc, text: str, filename: str) -> RuleSyntaxError:
    m = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
    if m:
        line, col = int(m.group(1)), int(m.group(2))
    else:  # "(at end of document)"
        line = text.count("\n") + 1
        col = len(text) - (text.rfind("\n") + 1) + 1
    msg = re.sub(r"\s*\(at [^)]*\)$", "", str(exc))
    lines = text.splitlines()
    return RuleSyntaxError(f"{filename}:{line}:{col}: {msg}",
                           (filename, line, col, lines[line - 1] if 0 < line <= len(lines) else ""))


# A TOML string standing in for an over-long integer, to find where it sits in the file.
_STAND_IN = "\x00hetflow-long-integer"
_STAND_IN_TOML = '"\\u0000hetflow-long-integer"'  # _STAND_IN written in TOML


def _long_integer(exc: ValueError, text: str, filename: str) -> RuleSyntaxError:
    """tomllib's ValueError for a decimal integer longer than ``sys.get_int_max_str_digits()``
    says no place: the rule and key of the literal (found by parsing again with a string
    in its place), or its line and column."""
    limit = sys.get_int_max_str_digits()
    msg = f"an integer of more than {limit} digits is beyond the bound of {MAX_INT_BITS} bits on integers"
    runs = list(re.finditer(r"\d(?:_?\d){%d,}" % limit, text)) if limit else []
    for run in runs:
        try:
            doc = tomllib.loads(text[:run.start()] + _STAND_IN_TOML + text[run.end():])
        except (tomllib.TOMLDecodeError, ValueError, RecursionError):
            continue  # digits inside a string, or another long integer after this one
        at = _where_is(_STAND_IN, doc.get("rule"), _At(filename, None, "", {}).named(1))
        if at is not None:
            return at.error(msg)
    if not runs:
        return RuleSyntaxError(f"{filename}: {exc}", (filename, None, None, None))
    line = text.count("\n", 0, runs[0].start()) + 1
    col = runs[0].start() - (text.rfind("\n", 0, runs[0].start()) + 1) + 1
    return RuleSyntaxError(f"{filename}:{line}:{col}: {msg}", (filename, line, col, None))


def _where_is(target, value, at: _At) -> _At | None:
    """The place of ``target`` in the parsed rule tables ``value`` (rules named as the
    loader names them), or None."""
    if value == target:
        return at
    if isinstance(value, dict):
        if at.key == "" and isinstance(value.get("name"), str):
            at = at.named(value["name"])
        return next((found for k, v in value.items() if (found := _where_is(target, v, at / k))), None)
    if isinstance(value, list):
        if at.key == "":  # the [[rule]] tables: each names its rule
            return next((found for k, v in enumerate(value) if (found := _where_is(target, v, at.named(k + 1)))), None)
        return next((found for k, v in enumerate(value) if (found := _where_is(target, v, at / k))), None)
    return None


_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "a list",
               dict: "a table"}


def _expect(value, types, at: _At, *path):
    """``value`` when it has one of ``types`` (a bool is no int here), else an error at
    ``at / path``; the place is spelled out only on error, so checks cost little."""
    types = types if isinstance(types, tuple) else (types,)
    if isinstance(value, types) and not (isinstance(value, bool) and bool not in types):
        if type(value) is int and value.bit_length() > MAX_INT_BITS:
            raise _at(at, path).error(f"an integer of {value.bit_length()} bits is beyond the bound of "
                                      f"{MAX_INT_BITS} bits on integers")
        return value
    at = _at(at, path)
    wanted = " or ".join(dict.fromkeys(_TYPE_NAMES.get(t, t.__name__) for t in types))
    if isinstance(value, bool):
        raise at.error(f"must be {wanted}, not a boolean")
    raise at.error(f"must be {wanted}, not {type(value).__name__} {value!r}")


def _at(at: _At, path) -> _At:
    for step in path:
        at = at / step
    return at


def _expression(value, at: _At) -> Expr:
    return parse(_expect(value, str, at), at.where())


def _rule(spec, at: _At) -> Rule:
    _expect(spec, dict, at)
    if "name" not in spec:
        raise at.error("a rule needs a name")
    name = _expect(spec["name"], str, at, "name")
    if not name:
        raise at.error("a rule name must not be empty")
    if at.key == "":   # a top-level rule: name it from here on (rules it adds keep its name)
        at = at.named(name)
    for key in spec:
        if key not in RULE_KEYS:
            raise at.error(f"unknown rule key {key!r} (keys: {', '.join(sorted(RULE_KEYS))})")
    when = _expression(spec["when"], at / "when") if "when" in spec else None
    pattern = _match(spec["match"], at / "match") if "match" in spec else None
    if "then" not in spec:
        raise at.error("needs 'then' (a list of actions)")
    then = spec["then"]
    if isinstance(then, dict):
        then = [then]
    _expect(then, list, at, "then")
    if not then:
        raise (at / "then").error("is empty: a rule needs an action")
    acts = [_action(item, at / "then" / k) for k, item in enumerate(then)]
    priority = _expect(spec.get("priority", 0), int, at, "priority")
    enabled = _expect(spec.get("enabled", True), bool, at, "enabled")
    description = _expect(spec.get("description", ""), str, at, "description")
    try:
        return Rule(name, when=[when] if when is not None else None, then=acts, priority=priority,
                    match=pattern, enabled=enabled, description=description)
    except RuleError as exc:
        raise at.error(str(exc)) from None


def _names(value, at: _At) -> tuple | str:
    if isinstance(value, str):
        return value
    _expect(value, list, at)
    if not value:
        raise at.error("is an empty list: name one or more (a rule matching none would never fire)")
    for k, item in enumerate(value):
        _expect(item, str, at, k)
    return tuple(value)


def _number(value, at: _At, low=0):
    value = _expect(value, (int, float), at)
    if not finite(value) or value < low:
        raise at.error(f"must be a number >= {low} and finite; got {value!r}")
    return value


def _dtype(value, at: _At) -> str:
    """A NumPy dtype name, checked now: matching with one NumPy does not know would
    disable the rule at the first safe point."""
    _expect(value, str, at)
    try:
        np.dtype(value)
    except (TypeError, ValueError):
        raise at.error(f"{value!r} is not a NumPy dtype (as in 'float32', 'int64')") from None
    return value


def _match(spec, at: _At):
    _expect(spec, dict, at)
    for key in spec:
        if key not in MATCH_KEYS:
            raise at.error(f"unknown match key {key!r} (keys: {', '.join(sorted(MATCH_KEYS))})")
    fields = {}
    for key in ("op", "kernel"):
        if key in spec:
            fields[key] = _names(spec[key], at / key)
    if "dtype" in spec:
        fields["dtype"] = _dtype(spec["dtype"], at / "dtype")
    for key in ("min_size", "max_size"):
        if key in spec:
            fields[key] = _number(spec[key], at / key)
    if fields.get("min_size", 0) > fields.get("max_size", math.inf):
        raise (at / "max_size").error(f"must be >= match.min_size ({fields['min_size']}); got {fields['max_size']}")
    if "device_kinds" in spec:
        kinds = _names(spec["device_kinds"], at / "device_kinds")
        fields["device_kinds"] = (kinds,) if isinstance(kinds, str) else kinds
    if "place" in spec:
        fields["place"] = _number(_expect(spec["place"], int, at, "place"), at / "place")
    element = NodePattern(**fields)
    if "chain" not in spec:
        for key in ("max_chain", "same_extent"):
            if key in spec:
                raise (at / key).error("needs match.chain")
        return element
    length = _expect(spec["chain"], int, at, "chain")
    if length < 1:
        raise (at / "chain").error(f"must be >= 1; got {length}")
    longest = spec.get("max_chain")
    if longest is not None and _expect(longest, int, at, "max_chain") < length:
        raise (at / "max_chain").error(f"must be >= match.chain ({length}); got {longest}")
    same = _expect(spec.get("same_extent", True), bool, at, "same_extent")
    return Chain(element, min_len=length, max_len=longest, same_extent=same)


def _action(spec, at: _At):
    _expect(spec, dict, at)
    kind = spec.get("action")
    if not isinstance(kind, str) or kind not in ACTION_KEYS:
        raise (at / "action").error(f"unknown action {kind!r} (actions: {', '.join(ACTION_KEYS)})")
    for key in spec:
        if key != "action" and key not in ACTION_KEYS[kind]:
            raise (at / key).error(f"action {kind!r} takes no key {key!r}"
                                   f" (keys: {', '.join(sorted(ACTION_KEYS[kind])) or 'none'})")
    try:
        return _BUILDERS[kind](spec, at)
    except RuleSyntaxError:
        raise
    except RuleError as exc:  # the action's own checks of its parameters
        raise at.error(str(exc)) from None


def _value(value, at: _At):
    """A number/boolean constant, or an expression string."""
    if isinstance(value, str):
        return _expression(value, at)
    return _expect(value, (int, float, bool), at)


def _kinds(spec, at: _At):
    if "kinds" not in spec:
        return None
    kinds = _names(spec["kinds"], at / "kinds")
    return (kinds,) if isinstance(kinds, str) else kinds


def _fuse(spec, at):
    return A.Fuse()


def _split(spec, at):
    fields = {"place": _expect(spec.get("place", True), bool, at, "place")}
    if "pieces" in spec:
        fields["pieces"] = _value(spec["pieces"], at / "pieces")
    try:
        return A.Split(**fields)
    except RuleError as exc:
        raise (at / "pieces").error(str(exc)) from None


def _substitute(spec, at):
    if "map" not in spec:
        raise at.error("substitute needs map = { name = \"replacement\" }")
    mapping = _expect(spec["map"], dict, at, "map")
    for key, value in mapping.items():
        _expect(value, str, at, "map", key)
        if value not in at.kernels and value not in library.KERNELS:  # else it fails only when it fires
            given = f" or the kernels given to the loader ({', '.join(sorted(at.kernels))})" if at.kernels else ""
            raise (at / "map" / key).error(f"no kernel {value!r} in hetflow.library "
                                           f"({', '.join(sorted(library.KERNELS))}){given}")
    return A.Substitute(mapping, at.kernels)


def _partition(spec, at):
    shares = None
    if "shares" in spec:
        table = _expect(spec["shares"], dict, at, "shares")
        shares = {k: _share(k, v, at / "shares" / k) for k, v in table.items()}
    return A.Partition(shares, kinds=_kinds(spec, at))


def _share(key: str, value, at: _At):
    """A share: an expression, or a constant checked here so that its error names its key."""
    value = _value(value, at)
    if not isinstance(value, Expr):
        try:
            A.check_share(key, value)
        except RuleError as exc:
            raise at.error(str(exc)) from None
    return value


def _compile(spec, at):
    return A.Compile(_kinds(spec, at))


def _set(spec, at):
    if "var" not in spec or "value" not in spec:
        raise at.error("set needs var and value")
    var = _expect(spec["var"], str, at, "var")
    value = _value(spec["value"], at / "value")
    # TOML spells nan and inf; a nan variable never equals itself, so every round
    # would see it changed and re-run the rules reading it.
    if isinstance(value, float) and not math.isfinite(value):
        raise (at / "value").error(f"must be a finite number, a boolean or an expression; got {value!r}")
    return A.Set(var, value)


def _add_rule(spec, at):
    if "rule" not in spec:
        raise at.error("add_rule needs rule = { name = ..., then = [...] }")
    return A.AddRule(_rule(spec["rule"], at / "rule"))


def _remove_rule(spec, at):
    if "name" not in spec:
        raise at.error("remove_rule needs name")
    return A.RemoveRule(_expect(spec["name"], str, at, "name"))


def _change_rule(spec, at):
    if "name" not in spec:
        raise at.error("change_rule needs name")
    name = _expect(spec["name"], str, at, "name")
    changes = {}
    if "priority" in spec:
        changes["priority"] = _expect(spec["priority"], int, at, "priority")
    if "enabled" in spec:
        changes["enabled"] = _expect(spec["enabled"], bool, at, "enabled")
    if "when" in spec:
        changes["when"] = [_expression(spec["when"], at / "when")]
    return A.ChangeRule(name, **changes)


_BUILDERS = {
    "fuse": _fuse,
    "split": _split,
    "substitute": _substitute,
    "partition": _partition,
    "compile": _compile,
    "set": _set,
    "add_rule": _add_rule,
    "remove_rule": _remove_rule,
    "change_rule": _change_rule,
}
