"""Rule files: rules written in TOML, loaded with tomllib, checked with positions.

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

Rule keys: ``name`` (required), ``when`` (an expression; default true), ``match``,
``then`` (required: a list of action tables), ``priority``, ``enabled``,
``description``. Match keys: ``op``, ``kernel`` (a name or a list), ``chain`` (minimum
length of a producer-consumer chain), ``max_chain``, ``same_extent``, ``dtype``,
``min_size``, ``max_size``, ``device_kinds``, ``place``. Actions and their keys:

- ``fuse``
- ``split``: ``pieces`` (number or expression), ``place`` (bool)
- ``substitute``: ``map`` (kernel or op name -> hetflow.library name or a name in the
  ``kernels`` given to the loader)
- ``partition``: ``shares`` (device id or kind -> number or expression), ``kinds``
- ``compile``: ``kinds``
- ``set``: ``var``, ``value`` (a number, a boolean or an expression; a string value is
  written as an expression string literal: ``value = "'fast'"``)
- ``add_rule``: ``rule`` (a rule table); ``remove_rule``: ``name``;
  ``change_rule``: ``name`` and any of ``priority``, ``enabled``, ``when``

Every error is a RuleSyntaxError naming the file, line and column: TOML errors where
tomllib found them, expression errors at the offending character inside the string.
"""
from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

from ..errors import RuleError, RuleSyntaxError
from . import actions as A
from . import lang
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


class _Source:
    """The file's text, to turn parsed values back into line and column."""

    def __init__(self, text: str, filename: str):
        self.text, self.filename = text, filename

    def position(self, offset: int) -> tuple[int, int]:
        line = self.text.count("\n", 0, offset) + 1
        return line, offset - (self.text.rfind("\n", 0, offset) + 1) + 1

    def line_text(self, line: int) -> str:
        lines = self.text.splitlines()
        return lines[line - 1] if 0 < line <= len(lines) else ""

    def error(self, msg: str, offset: int) -> RuleSyntaxError:
        line, col = self.position(offset)
        return RuleSyntaxError(f"{self.filename}:{line}:{col}: {msg}",
                               (self.filename, line, col, self.line_text(line)))

    def find_rule(self, name, start: int) -> int:
        if isinstance(name, str):
            m = re.compile(r"""\bname\s*=\s*(["'])""" + re.escape(name) + r"\1").search(self.text, start)
            if m:
                return m.start()
        m = re.compile(r"^\s*\[\[\s*rule\s*\]\]", re.M).search(self.text, start)
        return m.start() if m else start

    def find_key(self, key: str, start: int) -> int:
        """Offset of ``key = ...`` or of a ``[...key]`` / ``[[...key]]`` table header."""
        k = re.escape(key)
        m = re.compile(r"(?:^|[{,\s])" + k + r"\s*=|^\s*\[\[?\s*(?:[\w-]+\.)*" + k + r"\s*\]", re.M).search(
            self.text, start)
        if m is None:
            return start
        return m.start() + (len(m.group()) - len(m.group().lstrip("{, \t\n")))

    def find_string(self, value: str, start: int) -> int:
        """Offset of the first character of the string literal holding ``value`` (-1: none)."""
        found = [k + 1 for k in (self.text.find(q + value + q, start) for q in ('"', "'")) if k >= 0]
        if found:
            return min(found)
        return self.text.find(value, start)  # a literal with escapes or a multi-line string


def load(path, kernels: dict | None = None) -> list[Rule]:
    """The rules of a TOML rule file (UTF-8, as TOML is); RuleSyntaxError with file, line
    and column."""
    if not isinstance(path, (str, os.PathLike)):
        raise RuleError(f"a rule file is named by a path (str or os.PathLike), not {type(path).__name__}")
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RuleError(f"cannot read rule file {path}: {exc}") from exc
    except UnicodeDecodeError as exc:  # TOML is UTF-8: say where it is not
        before = exc.object[:exc.start]
        line, col = before.count(b"\n") + 1, exc.start - before.rfind(b"\n")
        raise RuleSyntaxError(f"{path}:{line}:{col}: the rule file is not UTF-8 (byte "
                              f"0x{exc.object[exc.start]:02x})", (str(path), line, col, None)) from None
    return loads(text, str(path), kernels)


def loads(text: str, filename: str = "<rules>", kernels: dict | None = None) -> list[Rule]:
    """The rules of TOML text (``filename`` is used in error messages)."""
    src = _Source(text, filename)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _toml_error(exc, src) from None
    for key in doc:
        if key != "rule":
            raise src.error(f"unknown top-level key {key!r} (a rule file has [[rule]] tables)",
                            src.find_key(key, 0))
    specs = doc.get("rule", [])
    if not isinstance(specs, list):
        raise src.error("'rule' must be an array of tables: write [[rule]]", src.find_key("rule", 0))
    rules, cursor, names = [], 0, set()
    for spec in specs:
        at = src.find_rule(spec.get("name") if isinstance(spec, dict) else None, cursor)
        rule = _rule(spec, src, at, kernels or {})
        if rule.name in names:
            raise src.error(f"duplicate rule name {rule.name!r}", at)
        names.add(rule.name)
        rules.append(rule)
        cursor = at + 1
    return rules


def _toml_error(exc, src: _Source) -> RuleSyntaxError:
    line, col = getattr(exc, "lineno", None), getattr(exc, "colno", None)
    msg = getattr(exc, "msg", str(exc))
    if line is None:
        m = re.search(r"\(at line (\d+), column (\d+)\)", str(exc))
        if m:
            line, col = int(m.group(1)), int(m.group(2))
        else:  # "(at end of document)"
            line = src.text.count("\n") + 1
            col = len(src.text) - (src.text.rfind("\n") + 1) + 1
        msg = re.sub(r"\s*\(at [^)]*\)$", "", str(exc))
    return RuleSyntaxError(f"{src.filename}:{line}:{col}: {msg}",
                           (src.filename, line, col, src.line_text(line)))


def _expect(value, types, what: str, src: _Source, at: int):
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise src.error(f"{what} must be {_type_names(types)}, not a boolean", at)
    if not isinstance(value, types):
        raise src.error(f"{what} must be {_type_names(types)}, not {type(value).__name__} {value!r}", at)
    return value


def _type_names(types) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "a list",
             dict: "a table"}
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(dict.fromkeys(names.get(t, t.__name__) for t in types))


def _expression(value: str, src: _Source, at: int) -> lang.Expr:
    start = src.find_string(value, at)
    if start < 0:
        start = at
    line, col = src.position(start)
    return lang.parse(value, lang.Where(src.filename, line, col, src.line_text(line)))


def _rule(spec, src: _Source, at: int, kernels: dict) -> Rule:
    _expect(spec, dict, "a rule", src, at)
    for key in spec:
        if key not in RULE_KEYS:
            raise src.error(f"unknown rule key {key!r} (keys: {', '.join(sorted(RULE_KEYS))})",
                            src.find_key(key, at))
    if "name" not in spec:
        raise src.error("a rule needs a name", at)
    name = _expect(spec["name"], str, "rule name", src, at)
    if not name:
        raise src.error("a rule name must not be empty", at)
    when = None
    if "when" in spec:
        when = _expression(_expect(spec["when"], str, f"rule {name!r}: when", src, src.find_key("when", at)),
                           src, src.find_key("when", at))
    pattern = _match(spec["match"], src, src.find_key("match", at), name) if "match" in spec else None
    if "then" not in spec:
        raise src.error(f"rule {name!r} needs 'then' (a list of actions)", at)
    then = spec["then"]
    then_at = src.find_key("then", at)
    if isinstance(then, dict):
        then = [then]
    _expect(then, list, f"rule {name!r}: then", src, then_at)
    if not then:
        raise src.error(f"rule {name!r}: 'then' is empty", then_at)
    acts, cursor = [], then_at
    for item in then:
        action, cursor = _action(item, src, cursor, name, kernels)
        acts.append(action)
    priority = _expect(spec.get("priority", 0), int, f"rule {name!r}: priority", src, src.find_key("priority", at))
    enabled = _expect(spec.get("enabled", True), bool, f"rule {name!r}: enabled", src, src.find_key("enabled", at))
    description = _expect(spec.get("description", ""), str, f"rule {name!r}: description", src, at)
    try:
        return Rule(name, when=[when] if when is not None else None, then=acts, priority=priority,
                    match=pattern, enabled=enabled, description=description)
    except RuleError as exc:
        raise src.error(str(exc), at) from None


def _names(value, what, src, at) -> tuple | str:
    if isinstance(value, str):
        return value
    _expect(value, list, what, src, at)
    for item in value:
        _expect(item, str, what + " entries", src, at)
    return tuple(value)


def _match(spec, src: _Source, at: int, rule: str):
    _expect(spec, dict, f"rule {rule!r}: match", src, at)
    for key in spec:
        if key not in MATCH_KEYS:
            raise src.error(f"rule {rule!r}: unknown match key {key!r} (keys: {', '.join(sorted(MATCH_KEYS))})",
                            src.find_key(key, at))
    fields = {}
    for key in ("op", "kernel"):
        if key in spec:
            fields[key] = _names(spec[key], f"match.{key}", src, src.find_key(key, at))
    if "dtype" in spec:
        fields["dtype"] = _expect(spec["dtype"], str, "match.dtype", src, src.find_key("dtype", at))
    for key in ("min_size", "max_size"):
        if key in spec:
            fields[key] = _expect(spec[key], (int, float), f"match.{key}", src, src.find_key(key, at))
    if "device_kinds" in spec:
        kinds = _names(spec["device_kinds"], "match.device_kinds", src, src.find_key("device_kinds", at))
        fields["device_kinds"] = (kinds,) if isinstance(kinds, str) else kinds
    if "place" in spec:
        fields["place"] = _expect(spec["place"], int, "match.place", src, src.find_key("place", at))
    element = NodePattern(**fields)
    if "chain" not in spec:
        for key in ("max_chain", "same_extent"):
            if key in spec:
                raise src.error(f"rule {rule!r}: match.{key} needs match.chain", src.find_key(key, at))
        return element
    chain_at = src.find_key("chain", at)
    length = _expect(spec["chain"], int, "match.chain", src, chain_at)
    if length < 1:
        raise src.error(f"rule {rule!r}: match.chain must be >= 1; got {length}", chain_at)
    longest = spec.get("max_chain")
    if longest is not None:
        _expect(longest, int, "match.max_chain", src, src.find_key("max_chain", at))
    same = _expect(spec.get("same_extent", True), bool, "match.same_extent", src, at)
    return Chain(element, min_len=length, max_len=longest, same_extent=same)


def _action(spec, src: _Source, at: int, rule: str, kernels: dict):
    _expect(spec, dict, f"rule {rule!r}: each action", src, at)
    kind = spec.get("action")
    if kind not in ACTION_KEYS:
        raise src.error(f"rule {rule!r}: unknown action {kind!r} (actions: {', '.join(ACTION_KEYS)})",
                        src.find_key("action", at))
    here = src.find_string(kind, at)
    here = here if here >= 0 else at
    for key in spec:
        if key != "action" and key not in ACTION_KEYS[kind]:
            raise src.error(f"rule {rule!r}: action {kind!r} takes no key {key!r}"
                            f" (keys: {', '.join(sorted(ACTION_KEYS[kind])) or 'none'})", src.find_key(key, here))
    return _BUILDERS[kind](spec, src, here, rule, kernels), here + 1


def _value(value, what, src, at):
    """A number/boolean constant, or an expression string."""
    if isinstance(value, str):
        return _expression(value, src, at)
    return _expect(value, (int, float, bool), what, src, at)


def _fuse(spec, src, at, rule, kernels):
    return A.Fuse()


def _split(spec, src, at, rule, kernels):
    pieces = _value(spec.get("pieces", "count('node')"), "split.pieces", src, src.find_key("pieces", at))
    place = _expect(spec.get("place", True), bool, "split.place", src, src.find_key("place", at))
    return A.Split(pieces=pieces, place=place)


def _substitute(spec, src, at, rule, kernels):
    if "map" not in spec:
        raise src.error(f"rule {rule!r}: substitute needs map = {{ name = \"replacement\" }}", at)
    mapping = _expect(spec["map"], dict, "substitute.map", src, src.find_key("map", at))
    for key, value in mapping.items():
        _expect(value, str, f"substitute.map.{key}", src, src.find_key(key, at))
    return A.Substitute(mapping, kernels)


def _partition(spec, src, at, rule, kernels):
    shares = None
    if "shares" in spec:
        shares_at = src.find_key("shares", at)
        table = _expect(spec["shares"], dict, "partition.shares", src, shares_at)
        shares = {k: _value(v, f"partition.shares.{k}", src, src.find_key(k, shares_at)) for k, v in table.items()}
    kinds = _names(spec["kinds"], "partition.kinds", src, src.find_key("kinds", at)) if "kinds" in spec else None
    return A.Partition(shares, kinds=(kinds,) if isinstance(kinds, str) else kinds)


def _compile(spec, src, at, rule, kernels):
    kinds = _names(spec["kinds"], "compile.kinds", src, src.find_key("kinds", at)) if "kinds" in spec else None
    return A.Compile((kinds,) if isinstance(kinds, str) else kinds)


def _set(spec, src, at, rule, kernels):
    if "var" not in spec or "value" not in spec:
        raise src.error(f"rule {rule!r}: set needs var and value", at)
    var = _expect(spec["var"], str, "set.var", src, src.find_key("var", at))
    return A.Set(var, _value(spec["value"], "set.value", src, src.find_key("value", at)))


def _add_rule(spec, src, at, rule, kernels):
    if "rule" not in spec:
        raise src.error(f"rule {rule!r}: add_rule needs rule = {{ name = ..., then = [...] }}", at)
    inner = spec["rule"]
    inner_at = src.find_rule(inner.get("name") if isinstance(inner, dict) else None, at)
    return A.AddRule(_rule(inner, src, inner_at, kernels))


def _remove_rule(spec, src, at, rule, kernels):
    if "name" not in spec:
        raise src.error(f"rule {rule!r}: remove_rule needs name", at)
    return A.RemoveRule(_expect(spec["name"], str, "remove_rule.name", src, src.find_key("name", at)))


def _change_rule(spec, src, at, rule, kernels):
    if "name" not in spec:
        raise src.error(f"rule {rule!r}: change_rule needs name", at)
    name = _expect(spec["name"], str, "change_rule.name", src, src.find_key("name", at))
    changes = {}
    if "priority" in spec:
        changes["priority"] = _expect(spec["priority"], int, "change_rule.priority", src, src.find_key("priority", at))
    if "enabled" in spec:
        changes["enabled"] = _expect(spec["enabled"], bool, "change_rule.enabled", src, src.find_key("enabled", at))
    if "when" in spec:
        when_at = src.find_key("when", at)
        changes["when"] = [_expression(_expect(spec["when"], str, "change_rule.when", src, when_at), src, when_at)]
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
