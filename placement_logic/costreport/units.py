"""Human units for exact byte counts: decimal (GB = 10^9 B) and binary (GiB = 2^30 B).

Input: a ``Fraction`` of bytes. Output: strings such as ``31.41 GB`` and ``29.25 GiB``,
rounded half-even with integer arithmetic (no floats).
"""

from __future__ import annotations

from fractions import Fraction

_DECIMAL = (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3))
_BINARY = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def decimal_string(x: Fraction, places: int = 2) -> str:
    """``x`` rounded to ``places`` decimals, trailing zeros dropped."""
    scaled = round(x * 10**places)
    sign = "-" if scaled < 0 else ""
    whole, frac = divmod(abs(scaled), 10**places)
    text = f"{whole}.{frac:0{places}d}".rstrip("0").rstrip(".") if places else str(whole)
    return sign + text


def _pick(x: Fraction, table) -> str:
    for unit, size in table:
        if abs(x) >= size:
            return f"{decimal_string(x / size)} {unit}"
    return f"{decimal_string(x)} B"


def gb(x: Fraction) -> str:
    return _pick(x, _DECIMAL)


def gib(x: Fraction) -> str:
    return _pick(x, _BINARY)


def both(x: Fraction | None) -> str:
    """``31.41 GB (29.25 GiB)``, or ``—`` when the value is not bound."""
    if x is None:
        return "—"
    if x == 0:
        return "0"
    return f"{gb(x)} ({gib(x)})"


def exact_bytes(x: Fraction | None) -> str:
    """The exact byte count with thousands separators, e.g. ``31,406,250,000 B``."""
    if x is None:
        return "—"
    if x.denominator == 1:
        return f"{x.numerator:,} B"
    return f"{x.numerator:,}/{x.denominator:,} B"


def labelled(x: Fraction | None, sep: str = "\n") -> str:
    """Human units on one line and the exact byte count on the next."""
    if x is None or x == 0:
        return both(x)
    return f"{both(x)}{sep}{exact_bytes(x)}"


def number(x: Fraction | None) -> str:
    if x is None:
        return "—"
    if x.denominator == 1:
        return str(x.numerator)
    return decimal_string(x, 4)


def ratio(x: Fraction | None) -> str:
    """A ratio as ``3/2 (1.5)``, or a bare integer or decimal."""
    if x is None:
        return "—"
    if x.denominator == 1:
        return str(x.numerator)
    if x.denominator <= 10**4:
        return f"{x.numerator}/{x.denominator} ({decimal_string(x, 4)})"
    return decimal_string(x, 4)


def seconds(x: Fraction | None) -> str:
    """A duration: ``6.61 s``, ``85.6 ms``, ``12.5 µs``."""
    if x is None:
        return "—"
    for unit, size in (("s", Fraction(1)), ("ms", Fraction(1, 10**3)), ("µs", Fraction(1, 10**6))):
        if abs(x) >= size:
            return f"{decimal_string(x / size, 3)} {unit}"
    return "0 s" if x == 0 else f"{decimal_string(x * 10**9, 3)} ns"


def percent(x: Fraction | None) -> str:
    return "—" if x is None else f"{decimal_string(x * 100, 2)} %"


def scaled(x: Fraction | None, unit: str = "") -> str:
    """A large count with an SI prefix: ``1.88 E`` FLOPs, ``634.43 k`` tokens/s."""
    if x is None:
        return "—"
    for prefix, size in (("E", 10**18), ("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if abs(x) >= size:
            return f"{decimal_string(x / size)} {prefix}{unit}"
    return f"{decimal_string(x)} {unit}".rstrip()


def of_row(key: str, x: Fraction | None, sep: str = "\n") -> str:
    """A compared quantity in its unit: seconds, tokens per second and MFU for the time rows
    (``time.*``), bytes for the rest."""
    if key == "time.step":
        return seconds(x)
    if key == "time.tokens_per_second":
        return scaled(x)
    if key == "time.mfu":
        return percent(x)
    return labelled(x, sep)
