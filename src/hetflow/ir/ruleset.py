"""Rule sets: rules by name, iterated by priority; hetflow's defaults and rule files
load into one."""
from __future__ import annotations

import copy
from typing import Iterable

from ..errors import RuleError
from .defaults import default_rules
from .rulefile import load
from .rules import Rule


class RuleSet:
    """An ordered, named collection of rules; iteration is by priority, highest first.

    Rules are kept by name as well, so adding, finding and removing one costs the same
    however many there are (a file of 10,000 rules loads in linear time).
    """

    def __init__(self, rules: Iterable[Rule] = ()):
        self._rules: dict[str, Rule] = {}   # by name, in the order they were added
        self.revision = 0
        for rule in rules:
            self.add(rule)

    @classmethod
    def default(cls) -> "RuleSet":
        """hetflow's default rules (see :mod:`hetflow.ir.defaults`)."""
        return cls(default_rules())

    @classmethod
    def load(cls, path, kernels: dict | None = None) -> "RuleSet":
        """Rules from a TOML file; ``kernels`` names replacement kernels for ``substitute``."""
        return cls(load(path, kernels))

    # -- editing -------------------------------------------------------------------------
    def add(self, rule: Rule) -> Rule:
        if not isinstance(rule, Rule):
            raise RuleError(f"a RuleSet holds Rule objects, not {type(rule).__name__}")
        if rule.name in self._rules:
            raise RuleError(f"rule set already has a rule named {rule.name!r}")
        self._rules[rule.name] = rule
        self.revision += 1
        return rule

    def extend(self, rules: Iterable[Rule]) -> "RuleSet":
        for rule in rules:
            self.add(rule)
        return self

    def remove(self, name: str) -> Rule:
        rule = self._find(name)
        del self._rules[name]
        self.revision += 1
        return rule

    def replace(self, rule: Rule) -> Rule:
        old = self._find(rule.name)
        self._rules[rule.name] = rule   # a dict keeps the key's place
        self.revision += 1
        return old

    def _find(self, name: str) -> Rule:
        rule = self.get(name)
        if rule is None:
            known = ", ".join(self.names()) or "none"
            raise RuleError(f"no rule named {name!r} (rules: {known})")
        return rule

    # -- reading -------------------------------------------------------------------------
    def get(self, name: str) -> Rule | None:
        return self._rules.get(name) if isinstance(name, str) else None

    def __contains__(self, name) -> bool:
        return self.get(name) is not None

    def __iter__(self):
        # sorted() is stable: equal priorities keep the order rules were added in.
        return iter(sorted(self._rules.values(), key=lambda r: -r.priority))

    def __len__(self):
        return len(self._rules)

    def names(self) -> list[str]:
        return [r.name for r in self]

    def copy(self) -> "RuleSet":
        """An independent copy: disabling or changing a rule in it leaves this set alone."""
        return RuleSet(copy.copy(r) for r in self._rules.values())

    def snapshot(self) -> tuple:
        return (dict(self._rules), self.revision)

    def restore(self, snapshot: tuple) -> None:
        self._rules, self.revision = dict(snapshot[0]), snapshot[1]

    def __repr__(self):
        return f"<RuleSet {self.names()}>"
