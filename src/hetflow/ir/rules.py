"""Rules: a predicate (left-hand side) and actions (right-hand side); rule sets are
:mod:`hetflow.ir.ruleset`.

A rule's predicate is a graph pattern (what it is matched against; see
:mod:`hetflow.ir.patterns`) and conditions that must all hold for a binding:
Python expressions over monitor variables (``"gpu.utilization > 0.5"``, checked and
compiled by :mod:`hetflow.ir.expressions`, never ``eval``-ed), topology
patterns, or callables ``(ctx, match) -> bool``. Its actions (see
:mod:`hetflow.ir.actions`) run in order on each binding for which the predicate holds.

    Rule("fuse-gpu", when=[Chain(NodePattern(op="forall", device_kinds=("gpu",))),
                           "count('gpu') > 0"],
         then=Fuse(), priority=10)

``then`` may also be a callable ``(ctx, match) -> None | Node | [Node]`` in the manner
of a PatternMatcher callback: None means no rewrite, nodes replace the matched ones.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from ..errors import RuleError
from .actions import Action, Replace
from .expressions import Expr, Where, parse
from .patterns import WHOLE_GRAPH, Chain, Match, NodePattern, TopologyPattern

GRAPH_PATTERNS = (NodePattern, Chain)


@dataclasses.dataclass(frozen=True)
class ExprCondition:
    """A condition written as a rule expression."""

    expr: Expr

    def __call__(self, ctx, match) -> bool:
        value = ctx.evaluate(self.expr, match)
        if value is not True and value is not False:
            raise RuleError(f"{self.expr.where or 'condition'}: {self.expr.text!r} gave {value!r}, "
                            f"not True or False")
        return value

    def names(self) -> set:
        return self.expr.names()


@dataclasses.dataclass(frozen=True)
class FunctionCondition:
    """A condition given as a Python callable ``(ctx, match) -> bool``."""

    fn: Callable

    def __call__(self, ctx, match) -> bool:
        return bool(self.fn(ctx, match))

    def names(self):
        return None  # reads anything: re-evaluate on every change


def _conditions(when, match, rule: str):
    """Split ``when`` into (graph pattern or None, conditions)."""
    items = [] if when is None else list(when) if isinstance(when, (list, tuple)) else [when]
    if match is not None:
        items.insert(0, match)
    pattern, conditions = None, []
    for item in items:
        if isinstance(item, GRAPH_PATTERNS):
            if pattern is not None:
                raise RuleError("a rule takes at most one graph pattern")
            pattern = item
        elif isinstance(item, str):
            conditions.append(ExprCondition(parse(item, Where(None, rule, "when"))))
        elif isinstance(item, Expr):
            conditions.append(ExprCondition(item))
        elif isinstance(item, (ExprCondition, FunctionCondition, TopologyPattern)):
            conditions.append(item)
        elif callable(item):
            conditions.append(FunctionCondition(item))
        else:
            raise RuleError(f"cannot use {item!r} as a rule predicate (give an expression string, "
                            f"a NodePattern/Chain, a TopologyPattern or a callable)")
    return pattern, tuple(conditions)


def _actions(then) -> tuple:
    items = [] if then is None else list(then) if isinstance(then, (list, tuple)) else [then]
    out = []
    for item in items:
        if isinstance(item, Action):
            out.append(item)
        elif callable(item):
            out.append(Replace(item))
        else:
            raise RuleError(f"cannot use {item!r} as a rule action (give an Action or a callable)")
    return tuple(out)


class Rule:
    """A named predicate/action pair with a priority (higher runs first)."""

    def __init__(self, name: str, when=None, then=(), priority: int = 0, *, match=None,
                 enabled: bool = True, description: str = ""):
        if not isinstance(name, str) or not name:
            raise RuleError(f"a rule needs a non-empty name; got {name!r}")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise RuleError(f"rule {name!r}: priority must be an integer; got {priority!r}")
        self.name = name
        self.pattern, self.conditions = _conditions(when, match, name)
        self.actions = _actions(then)
        if not self.actions:
            raise RuleError(f"rule {name!r} has no action")
        self.priority = priority
        self.enabled = bool(enabled)
        self.description = description
        self.error: str | None = None
        self._names_cache = (None, None)

    def replace(self, **changes) -> "Rule":
        """A copy with some of ``when``, ``then``, ``match``, ``priority``, ``enabled``,
        ``description`` changed (``when`` replaces conditions and pattern together)."""
        unknown = set(changes) - {"when", "then", "match", "priority", "enabled", "description"}
        if unknown:
            raise RuleError(f"rule {self.name!r}: cannot change {', '.join(sorted(unknown))}")
        new = Rule.__new__(Rule)
        new.__dict__.update(self.__dict__)
        if "when" in changes or "match" in changes:
            when = changes.get("when", list(self.conditions))
            match = changes.get("match", self.pattern)
            new.pattern, new.conditions = _conditions(when, match, self.name)
        if "then" in changes:
            new.actions = _actions(changes["then"])
        for key in ("priority", "enabled", "description"):
            if key in changes:
                setattr(new, key, changes[key])
        new.error = None
        return new

    # -- evaluation ---------------------------------------------------------------------
    def matches(self, ctx, anchor=None) -> list[Match]:
        """Bindings of the graph pattern (anchored at ``anchor`` for attached rules)."""
        if self.pattern is None:
            return [Match((anchor,))] if anchor is not None else [WHOLE_GRAPH]
        return list(self.pattern.matches(ctx.visible(), ctx.topology, anchor))

    def holds(self, ctx, match) -> bool:
        return all(cond(ctx, match) for cond in self.conditions)

    def fire(self, ctx, match) -> None:
        for action in self.actions:
            action.apply(ctx, match)

    def names(self) -> set | None:
        """Variables the rule reads (None: it may read any, through a callable)."""
        cached_for, _ = self._names_cache
        if cached_for is None or cached_for[0] is not self.conditions or cached_for[1] is not self.actions:
            found = set()
            for part in (*self.conditions, *self.actions):
                names = part.names() if hasattr(part, "names") else set()
                if names is None:
                    found = None
                    break
                found |= names
            self._names_cache = ((self.conditions, self.actions), found)
        found = self._names_cache[1]
        return None if found is None else set(found)

    def disable(self, error: str) -> None:
        self.enabled, self.error = False, error

    def _key(self):
        return (self.name, self.pattern, self.conditions, self.actions, self.priority, self.enabled)

    def __eq__(self, other):
        return isinstance(other, Rule) and self._key() == other._key()

    def __hash__(self):
        return hash(self.name)

    def __repr__(self):
        state = "" if self.enabled else f" disabled ({self.error})" if self.error else " disabled"
        return f"<Rule {self.name} priority={self.priority}{state}>"
