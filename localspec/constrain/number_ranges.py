"""A JSON schema's numeric bounds as grammar rules: the numbers between two bounds, as JSON writes them.

llama-cpp-python's schema converter leaves ``minimum``, ``maximum`` and their exclusive forms out (its
"TODO"), so the output broke them. These rules hold them exactly, as patterns of digit classes:

- an integer range (:func:`integer_range`) is the integers from ``lo`` to ``hi``: no leading zero, no
  ``-0``, at most the converter's 16 digits;
- a number range (:func:`number_range`) is the decimals between two bounds, each inclusive or exclusive:
  an integer part as above, then no fraction or ``.`` and 1 to 16 fraction digits (more after the
  leading zeros of one above an exclusive bound); never an
  exponent (a subset of what JSON allows: what a model writes for a bounded number). The digits after
  the point are matched by comparing them with the bound's, position by position (``0.F <= 0.5`` holds
  for ``4999`` and ``5``, ``50``, not ``51``).

Both are lists of patterns that the GBNF writers (:func:`integer_range_gbnf`, :func:`number_range_gbnf`)
and the tests' regular expressions spell the same way, so a property test against comparing the numbers
themselves checks the grammar.
"""

from __future__ import annotations

from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, localcontext

#: Digits of the longest integer the converter's own rule writes (``[1-9] [0-9]{0,15}``): an open bound
#: reaches that far.
INTEGER_DIGITS = 16
#: Fraction digits a bounded number may write (the converter's ``[0-9]{1,16}``); a bound with more is
#: rounded inwards, which only narrows what is allowed.
FRACTION_DIGITS = 16

Digits = tuple[tuple[int, int], ...]  # one (lowest, highest) digit per position
#: (lowest digit, highest digit, fewest, most): that digit class repeated fewest..most times.
Run = tuple[int, int, int, int]
#: A digit string as runs, one after the other.
Pattern = tuple[Run, ...]
#: A number: sign ("" or "-"), its integer part's digits, whether it may end there (no fraction), and
#: the patterns its fraction digits (after ".") may take.
NumberPattern = tuple[str, Digits, bool, tuple[Pattern, ...]]


# -- integers -------------------------------------------------------------------------------------------
def _same_length(lo: str, hi: str) -> list[Digits]:
    """Digit patterns matching exactly the numbers from ``lo`` to ``hi``, written with as many digits."""
    if not lo:
        return [()]
    a, b = int(lo[0]), int(hi[0])
    rest = len(lo) - 1
    if a == b:
        return [((a, a), *tail) for tail in _same_length(lo[1:], hi[1:])]
    full: Digits = ((0, 9),) * rest
    out: list[Digits] = []
    first, last = a, b  # the leading digits whose every continuation is in range
    if lo[1:] != "0" * rest:
        out += [((a, a), *t) for t in _same_length(lo[1:], "9" * rest)]
        first = a + 1
    tail_hi = [((b, b), *t) for t in _same_length("0" * rest, hi[1:])] if hi[1:] != "9" * rest else []
    if tail_hi:
        last = b - 1
    if first <= last:
        out.append(((first, last), *full))
    return out + tail_hi


def _magnitudes(lo: int, hi: int) -> list[Digits]:
    """Digit patterns matching the numbers ``lo`` to ``hi`` (0 <= lo <= hi) without leading zeros."""
    out: list[Digits] = []
    for n in range(len(str(lo)), len(str(hi)) + 1):
        start, stop = max(lo, 10 ** (n - 1) if n > 1 else 0), min(hi, 10**n - 1)
        if start <= stop:
            out += _same_length(str(start), str(stop))
    return out


def integer_range(lo: int | None, hi: int | None) -> list[tuple[str, Digits]]:
    """The integers from ``lo`` to ``hi`` (None: no bound, as far as the converter's 16 digits go) as JSON
    writes them, one (sign, digits) pattern each: no leading zeros, no ``-0``."""
    top = 10**INTEGER_DIGITS - 1
    lo, hi = -top if lo is None else max(lo, -top), top if hi is None else min(hi, top)
    out: list[tuple[str, Digits]] = []
    if lo < 0:
        out += [("-", d) for d in _magnitudes(max(1, -min(hi, -1)), -lo)]
    if hi >= 0:
        out += [("", d) for d in _magnitudes(max(lo, 0), hi)]
    return out


def _digit_gbnf(d: tuple[int, int]) -> str:
    return f'"{d[0]}"' if d[0] == d[1] else f"[{d[0]}-{d[1]}]"


def _digits_gbnf(digits: Digits) -> list[str]:
    """Runs of one digit class written with a count: ``[0-9]{3}`` rather than three classes."""
    parts, i = [], 0
    while i < len(digits):
        j = i
        while j < len(digits) and digits[j] == digits[i]:
            j += 1
        parts.append(_digit_gbnf(digits[i]) + (f"{{{j - i}}}" if j - i > 1 else ""))
        i = j
    return parts


def integer_range_gbnf(lo: int | None, hi: int | None) -> str:
    """:func:`integer_range` as a GBNF alternation."""
    alternatives = (" ".join(['"-"'] * bool(s) + _digits_gbnf(d)) for s, d in integer_range(lo, hi))
    return "(" + " | ".join(alternatives) + ")"


# -- numbers --------------------------------------------------------------------------------------------
class Bound:
    """One end of a number range: a finite ``value``, inclusive or not."""

    __slots__ = ("inclusive", "value")

    def __init__(self, value: Decimal | int | float, inclusive: bool = True) -> None:
        self.value = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
        self.inclusive = inclusive

    def __repr__(self) -> str:
        return f"Bound({self.value}, {'inclusive' if self.inclusive else 'exclusive'})"


def _split(value: Decimal) -> tuple[int, str]:
    """A non-negative decimal as its integer part and its fraction digits, without trailing zeros."""
    whole, _, fraction = format(value, "f").partition(".")
    return int(whole), fraction.rstrip("0")


def _inwards(bound: Bound, *, lower: bool) -> Bound:
    """``bound`` rounded to :data:`FRACTION_DIGITS` towards the inside of the range (then it is inclusive):
    an exact bound stays as it is."""
    with localcontext() as ctx:
        ctx.prec = INTEGER_DIGITS + FRACTION_DIGITS + 8  # exact for every value a range keeps
        step = Decimal(1).scaleb(-FRACTION_DIGITS)
        rounded = bound.value.quantize(step, rounding=ROUND_CEILING if lower else ROUND_FLOOR)
    return bound if rounded == bound.value else Bound(rounded, inclusive=True)


def _fractions(
    lo: str | None, lo_inclusive: bool, hi: str | None, hi_inclusive: bool, room: int
) -> tuple[bool, list[Pattern]]:
    """The fraction digit strings F with ``0.lo <= 0.F <= 0.hi`` (strict where not inclusive; None: no
    bound on that side), at most ``room`` digits (``room`` more after the leading zeros of a fraction
    that must not be 0): whether F may be empty (no digits: 0), and patterns for the non-empty ones.
    ``lo`` and ``hi`` have no trailing zeros."""
    empty_ok = (lo is None or (lo == "" and lo_inclusive)) and (hi is None or hi != "" or hi_inclusive)
    if lo == "" and lo_inclusive:
        lo = None  # 0.F >= 0 always holds
    if room == 0 or (hi == "" and not hi_inclusive):  # no digits left, or 0.F < 0: none at all
        return empty_ok, []
    if lo is None and hi is None:
        return empty_ok, [((0, 9, 1, room),)]
    if lo is None and hi == "":  # 0.F <= 0: zeros only
        return empty_ok, [((0, 0, 1, room),)]
    if lo == "" and hi is None:  # 0.F > 0: a non-zero digit somewhere
        return empty_ok, [((0, 0, 0, room - 1), (1, 9, 1, 1), (0, 9, 0, room - 1))]
    first = int(lo[0]) if lo else 0
    last = int(hi[0]) if hi else (0 if hi == "" else 9)
    out: list[Pattern] = []
    free: list[int] = []  # digits whose every continuation is in range
    for d in range(first, last + 1):
        on_lo = lo is not None and d == (int(lo[0]) if lo else 0)
        on_hi = hi is not None and d == (int(hi[0]) if hi else 0)
        if not on_lo and not on_hi:
            free.append(d)
            continue
        tail_ok, tails = _fractions(
            (lo[1:] if lo else "") if on_lo else None,
            lo_inclusive,
            (hi[1:] if hi else "") if on_hi else None,
            hi_inclusive,
            room - 1,
        )
        here: Run = (d, d, 1, 1)
        out += [(here,)] * tail_ok + [(here, *t) for t in tails]
    if free:
        out.append(((free[0], free[-1], 1, 1),) + (((0, 9, 0, room - 1),) if room > 1 else ()))
    return empty_ok, out


def _non_negative(lo: Bound, hi: Bound | None) -> list[NumberPattern]:
    """The numbers from ``lo`` (>= 0) to ``hi`` (None: as far as 16 integer digits go), without a sign;
    both within 16 integer digits."""
    top = 10**INTEGER_DIGITS - 1
    lo = _inwards(lo, lower=True)
    a, alpha = _split(lo.value)
    if hi is not None:
        hi = _inwards(hi, lower=False)
    out: list[NumberPattern] = []

    def add(whole: list[Digits], fraction: tuple[bool, list[Pattern]]) -> None:
        bare, patterns = fraction
        if bare or patterns:
            out.extend(("", d, bare, tuple(patterns)) for d in whole)

    def exact(n: int) -> list[Digits]:
        return [tuple((int(c), int(c)) for c in str(n))]

    if hi is not None:
        b, beta = _split(hi.value)
        if a == b:
            add(exact(a), _fractions(alpha, lo.inclusive, beta, hi.inclusive, FRACTION_DIGITS))
            return out
    add(exact(a), _fractions(alpha, lo.inclusive, None, True, FRACTION_DIGITS))
    if hi is None:
        add(_magnitudes(a + 1, top), _fractions(None, True, None, True, FRACTION_DIGITS))
        return out
    if a + 1 <= b - 1:
        add(_magnitudes(a + 1, b - 1), _fractions(None, True, None, True, FRACTION_DIGITS))
    add(exact(b), _fractions(None, True, beta, hi.inclusive, FRACTION_DIGITS))
    return out


def number_range(lo: Bound | None, hi: Bound | None) -> list[NumberPattern]:
    """The decimals from ``lo`` to ``hi`` (None: no bound) as JSON writes them without an exponent: no
    leading zeros, no ``-0``, no ``-0.0``. Empty when no number is in between. A bound past 16 integer
    digits is no bound (an open end reaches no further either)."""
    top = Decimal(10**INTEGER_DIGITS - 1)
    if (lo is not None and lo.value > top) or (hi is not None and hi.value < -top):
        return []
    lo = None if lo is None or lo.value < -top else lo
    hi = None if hi is None or hi.value > top else hi
    if lo is not None and hi is not None:
        if lo.value > hi.value or (lo.value == hi.value and not (lo.inclusive and hi.inclusive)):
            return []
    zero = Decimal(0)
    out: list[NumberPattern] = []
    if lo is None or lo.value < zero:  # the negative ones, as magnitudes above 0
        if hi is not None and hi.value < zero:
            smallest = Bound(-hi.value, hi.inclusive)
        else:
            smallest = Bound(zero, inclusive=False)
        largest = None if lo is None else Bound(-lo.value, lo.inclusive)
        if (
            largest is None
            or smallest.value < largest.value
            or (smallest.value == largest.value and smallest.inclusive and largest.inclusive)
        ):
            out += [("-", d, bare, f) for _, d, bare, f in _non_negative(smallest, largest)]
    if hi is None or hi.value > zero or (hi.value == zero and hi.inclusive):
        start = lo if lo is not None and lo.value >= zero else Bound(zero)
        out += _non_negative(start, hi)
    return out


def _run_gbnf(run: Run) -> str:
    low, high, fewest, most = run
    cls = _digit_gbnf((low, high))
    if (fewest, most) == (1, 1):
        return cls
    return cls + (f"{{{fewest}}}" if fewest == most else f"{{{fewest},{most}}}")


def number_range_gbnf(lo: Bound | None, hi: Bound | None) -> str:
    """:func:`number_range` as a GBNF alternation; call it only when the range holds a number."""
    alternatives = []
    for sign, digits, bare, fractions in number_range(lo, hi):
        head = " ".join(['"-"'] * bool(sign) + _digits_gbnf(digits))
        tails = [" ".join(_run_gbnf(r) for r in p) for p in fractions]
        if tails:
            dot = '"." (' + " | ".join(tails) + ")"
            head += f" ({dot})" + ("?" if bare else "")
        alternatives.append(head)
    assert alternatives, "number_range_gbnf of an empty range"
    return "(" + " | ".join(alternatives) + ")"
