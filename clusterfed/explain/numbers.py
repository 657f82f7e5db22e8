"""Numbers that a sentence compares, printed so that the printed comparison is true.

A sentence such as ``best silhouette 0.18 < 0.18`` is false as printed: both values were
rounded to two digits. ``compared(a, "<", b)`` prints both with the fewest digits (two at
least) that keep the comparison true as printed, and says ``<=``/``>=`` in place of a strict
operator when the two values are equal. ``false_comparisons(text)`` finds the numeric
comparisons a sentence quotes (``0.412 < required 0.450``, ``γ 0.3 >= bound 0.2``) whose
printed numbers contradict the operator; the tests run it over every explanation.
"""

from __future__ import annotations

import operator
import re

OPERATORS = {"<": operator.lt, "<=": operator.le, "≤": operator.le, ">": operator.gt, ">=": operator.ge,
             "≥": operator.ge}
LOOSE = {"<": "<=", ">": ">="}  # a strict comparison of two equal values is said loosely
MAX_DIGITS = 12

NUMBER = r"(?<![\w.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w.])"
# a number, an operator, at most three words naming the other side ("required", "min-silhouette",
# "merge-min-cosine", "ε"), the number compared with
COMPARISON = re.compile(rf"({NUMBER})\s*(<=|>=|≤|≥|<|>)\s*((?:[^\s\d;,()<>=][^\s;,()<>=]*\s+){{0,3}})({NUMBER})")


def _fixed(value: float, digits: int) -> str:
    return f"{value:.{digits}f}"


def shown(a: float, op: str, b: float, digits: int = 2) -> tuple[str, str, str]:
    """``a``, the operator and ``b`` as a sentence prints them: each number with ``digits``
    decimals, or more where fewer would print a comparison that does not hold (0.178 < 0.18 is
    printed ``0.178 < 0.180``, never ``0.18 < 0.18``); a strict operator between equal values
    becomes ``<=``/``>=``. ValueError when ``a op b`` is false itself."""
    a, b = float(a), float(b)
    if op not in OPERATORS:
        raise ValueError(f"unknown comparison {op!r}: one of {', '.join(OPERATORS)}")
    if a == b and op in LOOSE:
        op = LOOSE[op]
    if not OPERATORS[op](a, b):
        raise ValueError(f"{a!r} {op} {b!r} is false: say the comparison that holds")
    for places in range(digits, MAX_DIGITS + 1):
        left, right = _fixed(a, places), _fixed(b, places)
        if OPERATORS[op](float(left), float(right)):
            return left, op, right
    return repr(a), op, repr(b)


def compared(a: float, op: str, b: float, digits: int = 2, *, between: str = "") -> str:
    """``a op b`` printed true (``shown``); ``between``: the words naming ``b`` (``"required"``
    -> ``0.178 < required 0.180``)."""
    left, op, right = shown(a, op, b, digits)
    return f"{left} {op} {between + ' ' if between else ''}{right}"


def comparisons(text: str) -> list[tuple[float, str, float, str]]:
    """Every numeric comparison ``text`` quotes: (left, operator, right, as printed)."""
    return [(float(m.group(1)), m.group(2), float(m.group(4)), m.group(0)) for m in COMPARISON.finditer(text)]


def false_comparisons(text: str) -> list[str]:
    """The comparisons ``text`` quotes whose printed numbers contradict their operator."""
    return [printed for left, op, right, printed in comparisons(text) if not OPERATORS[op](left, right)]
