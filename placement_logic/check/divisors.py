"""The divisors of a whole number, however large (a model's ``seq = 10**30``): trial division by the small
primes, then Pollard's rho (Brent's variant) on what is left, each factor's primality by Miller–Rabin with the
first twelve prime bases (exact below 3.3·10^24; beyond, a composite passes with probability below 4^-12)."""

from __future__ import annotations

import math
from itertools import count

SMALL = 10_000
BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    for p in BASES:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _rho(n: int) -> int:
    """A proper factor of the composite n."""
    for c in count(1):
        x = y = 2
        d = 1
        while d == 1:
            x = (x * x + c) % n
            y = (y * y + c) % n
            y = (y * y + c) % n
            d = math.gcd(abs(x - y), n)
        if d != n:
            return d
    raise AssertionError("unreachable")


def _factor(n: int, out: dict[int, int]) -> None:
    if n == 1:
        return
    if is_prime(n):
        out[n] = out.get(n, 0) + 1
        return
    d = _rho(n)
    _factor(d, out)
    _factor(n // d, out)


def divisors(v: int) -> list[int]:
    """Every positive divisor of v ≥ 1, ascending."""
    primes: dict[int, int] = {}
    for p in range(2, SMALL):
        while v % p == 0:
            primes[p] = primes.get(p, 0) + 1
            v //= p
        if p * p > v:
            break
    _factor(v, primes)
    out = [1]
    for p, e in primes.items():
        out = [d * p ** k for d in out for k in range(e + 1)]
    return sorted(out)
