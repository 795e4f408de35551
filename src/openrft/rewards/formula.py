"""A safe formula language for ``multi`` graders' ``calculate_output`` (no ``eval``).

Grammar (usual precedence, ``^`` right-associative and above unary minus, as in ``-2^2 = -4``)::

    expr   := term (('+' | '-') term)*
    term   := unary (('*' | '/') unary)*
    unary  := ('+' | '-') unary | power
    power  := atom ('^' unary)?
    atom   := NUMBER | NAME | NAME '(' expr (',' expr)* ')' | '(' expr ')'

Functions: ``min max`` (one or more arguments), ``abs floor ceil exp sqrt log`` (one; ``log`` is
natural, ``log(x, base)`` also accepted). Names are the multi grader's keys. Division by zero and
math domain errors raise ``FormulaRuntimeError`` at evaluation.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

_TOKEN = re.compile(r"\s*(?:(\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|([A-Za-z_][A-Za-z0-9_]*)|(\*\*|[-+*/^(),]))")
_NUMBER_WITH_EXP = re.compile(r"\s*((?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)")

FUNCTIONS = {
    "min": (lambda *args: min(args), 1, None),
    "max": (lambda *args: max(args), 1, None),
    "abs": (abs, 1, 1),
    "floor": (math.floor, 1, 1),
    "ceil": (math.ceil, 1, 1),
    "exp": (math.exp, 1, 1),
    "sqrt": (math.sqrt, 1, 1),
    "log": (math.log, 1, 2),
}


class FormulaError(ValueError):
    """A formula that does not parse or names an unknown variable (a configuration error)."""


class FormulaRuntimeError(ArithmeticError):
    """Evaluation failed: division by zero, a math domain error, an overflow."""


@dataclass(frozen=True)
class Formula:
    source: str
    tree: tuple
    names: frozenset[str]

    def evaluate(self, values: Mapping[str, float]) -> float:
        try:
            result = float(_eval(self.tree, values))
        except ZeroDivisionError:
            raise FormulaRuntimeError(f"{self.source[:200]!r} divides by zero with {dict(values)}") from None
        except (ValueError, OverflowError) as exc:
            raise FormulaRuntimeError(f"{self.source[:200]!r} failed with {dict(values)}: {exc}") from None
        if not math.isfinite(result):
            raise FormulaRuntimeError(f"{self.source[:200]!r} gave {result} with {dict(values)}")
        return result


def _tokens(source: str) -> list[tuple[str, str, int]]:
    out, pos = [], 0
    while pos < len(source):
        if source[pos:].strip() == "":
            break
        number = _NUMBER_WITH_EXP.match(source, pos)
        if number:
            out.append(("num", number.group(1), number.start(1)))
            pos = number.end()
            continue
        match = _TOKEN.match(source, pos)
        if not match or match.end() == pos:
            where = len(source) - len(source[pos:].lstrip())
            raise FormulaError(f"unexpected character {source[where]!r} at position {where}")
        if match.group(2):
            out.append(("name", match.group(2), match.start(2)))
        else:
            op = "^" if match.group(3) == "**" else match.group(3)
            out.append(("op", op, match.start(3)))
        pos = match.end()
    out.append(("end", "", len(source)))
    return out


class _Parser:
    def __init__(self, source: str):
        self.source = source
        self.tokens = _tokens(source)
        self.i = 0

    def peek(self) -> tuple[str, str, int]:
        return self.tokens[self.i]

    def take(self, value: str | None = None) -> tuple[str, str, int]:
        token = self.tokens[self.i]
        if value is not None and token[1] != value:
            found = "the end" if token[0] == "end" else repr(token[1])
            raise FormulaError(f"expected {value!r} at position {token[2]}, found {found}")
        self.i += 1
        return token

    def parse(self) -> tuple:
        tree = self.expr()
        kind, value, pos = self.peek()
        if kind != "end":
            raise FormulaError(f"unexpected {value!r} at position {pos}")
        return tree

    def expr(self) -> tuple:
        tree = self.term()
        while self.peek()[1] in ("+", "-") and self.peek()[0] == "op":
            op = self.take()[1]
            tree = (op, tree, self.term())
        return tree

    def term(self) -> tuple:
        tree = self.unary()
        while self.peek()[1] in ("*", "/") and self.peek()[0] == "op":
            op = self.take()[1]
            tree = (op, tree, self.unary())
        return tree

    def unary(self) -> tuple:
        if self.peek()[0] == "op" and self.peek()[1] in ("+", "-"):
            op = self.take()[1]
            operand = self.unary()
            return ("neg", operand) if op == "-" else operand
        return self.power()

    def power(self) -> tuple:
        base = self.atom()
        if self.peek()[0] == "op" and self.peek()[1] == "^":
            self.take()
            return ("^", base, self.unary())
        return base

    def atom(self) -> tuple:
        kind, value, pos = self.take()
        if kind == "num":
            return ("num", float(value))
        if kind == "name":
            if self.peek()[1] == "(" and self.peek()[0] == "op":
                if value not in FUNCTIONS:
                    raise FormulaError(f"unknown function {value!r} at position {pos}; allowed: {', '.join(FUNCTIONS)}")
                self.take("(")
                args = [self.expr()]
                while self.peek()[1] == ",":
                    self.take(",")
                    args.append(self.expr())
                self.take(")")
                _, low, high = FUNCTIONS[value]
                if len(args) < low or (high is not None and len(args) > high):
                    wanted = str(low) if high == low else f"{low} or more" if high is None else f"{low}-{high}"
                    raise FormulaError(f"{value}() at position {pos} takes {wanted} argument(s), got {len(args)}")
                return ("call", value, tuple(args))
            return ("var", value)
        if kind == "op" and value == "(":
            tree = self.expr()
            self.take(")")
            return tree
        found = "the end" if kind == "end" else repr(value)
        raise FormulaError(f"expected a number, a name or '(' at position {pos}, found {found}")


def _names(tree: tuple) -> set[str]:
    tag = tree[0]
    if tag == "var":
        return {tree[1]}
    if tag == "num":
        return set()
    if tag == "call":
        return set().union(*(_names(a) for a in tree[2]))
    return set().union(*(_names(t) for t in tree[1:]))


def _eval(tree: tuple, values: Mapping[str, float]) -> float:
    tag = tree[0]
    if tag == "num":
        return tree[1]
    if tag == "var":
        return values[tree[1]]
    if tag == "neg":
        return -_eval(tree[1], values)
    if tag == "call":
        function = FUNCTIONS[tree[1]][0]
        return float(function(*(_eval(a, values) for a in tree[2])))
    left, right = _eval(tree[1], values), _eval(tree[2], values)
    if tag == "+":
        return left + right
    if tag == "-":
        return left - right
    if tag == "*":
        return left * right
    if tag == "/":
        return left / right
    if tag == "^":
        result = left**right
        if isinstance(result, complex):
            raise ValueError(f"{left} ^ {right} is not a real number")
        return result
    raise AssertionError(tag)


MAX_FORMULA_CHARS = 10_000
MAX_FORMULA_DEPTH = 64
"""Operations nested in each other (``a+a+...`` counts each ``+``): evaluation recurses once per level."""


def _depth(tree: tuple) -> int:
    if tree[0] in ("num", "var"):
        return 1
    children = tree[2] if tree[0] == "call" else tree[1:]
    return 1 + max((_depth(c) for c in children), default=0)


def compile_formula(source: str, names: set[str] | frozenset[str] | None = None) -> Formula:
    """Parse ``source``; with ``names``, every variable must be one of them."""
    if not source.strip():
        raise FormulaError("is empty")
    if len(source) > MAX_FORMULA_CHARS:
        raise FormulaError(f"is {len(source):,} characters long, more than the cap of {MAX_FORMULA_CHARS:,}")
    try:
        tree = _Parser(source).parse()
        deep = _depth(tree) > MAX_FORMULA_DEPTH
    except RecursionError:
        deep = True
    if deep:
        raise FormulaError(f"nests deeper than the cap of {MAX_FORMULA_DEPTH} levels")
    used = _names(tree)
    if names is not None:
        unknown = sorted(used - set(names))
        if unknown:
            raise FormulaError(f"names {', '.join(unknown)} that are not graders; known: {', '.join(sorted(names))}")
    return Formula(source, tree, frozenset(used))
