"""Hadamard matrices for LinearPatch's rotated basis.

A Hadamard matrix H of order n has ±1 entries and H·Hᵀ = n·I, so H/√n is orthogonal.
LinearPatch measures per-channel scales in the basis x·H/√n, where massive-activation
outliers are spread over all channels. Hidden sizes of real models are rarely powers of
two (576, 896, 3072, 5120, ...), so besides Sylvester's doubling we build the Paley
constructions for a small odd-ish factor q and combine them by Kronecker product:

    H(q·2^k) = H_paley(q) ⊗ H_sylvester(2^k)

Paley I gives order q = p + 1 for a prime power p ≡ 3 (mod 4); Paley II gives order
q = 2(p + 1) for a prime power p ≡ 1 (mod 4). Together with Sylvester doubling this covers
q ∈ {1, 2, 4, 8, 12, 20, 24, 28, 36, 40, 44, 48, 52, 56, 60, ...}.
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch

_MAX_PALEY_ORDER = 1024  # Paley factors are built by O(q²) Python loops; larger q is never needed


def hadamard(n: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Return a Hadamard matrix of order n (±1 entries, H·Hᵀ = n·I) as a fresh tensor."""
    return _hadamard_int8(n).to(dtype)  # (n, n)


def normalized_hadamard(n: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Return the orthogonal matrix H/√n (so Hn·Hnᵀ = I)."""
    return (_hadamard_int8(n).to(torch.float64) / math.sqrt(n)).to(dtype)  # (n, n)


def has_hadamard(n: int) -> bool:
    """True when `hadamard(n)` has a construction (no matrix is built)."""
    return _factorisation(n) is not None


@lru_cache(maxsize=16)
def _hadamard_int8(n: int) -> torch.Tensor:
    """Cached ±1 int8 master copy (1 byte per entry keeps large orders cheap to cache)."""
    plan = _factorisation(n)
    if plan is None:
        raise ValueError(
            f"no Hadamard construction for n={n}: n must be q·2^k with q = 1, "
            f"q − 1 a prime power ≡ 3 (mod 4) or q/2 − 1 a prime power ≡ 1 (mod 4)"
        )
    q, power_of_two = plan
    return torch.kron(_paley(q).to(torch.int8), _sylvester(power_of_two))  # (n, n)


def _factorisation(n: int) -> tuple[int, int] | None:
    """Split n = q·2^k with the smallest buildable core q; None if impossible.

    The smallest q means powers of two get plain (symmetric) Sylvester matrices.
    """
    if not isinstance(n, int) or n < 1:
        return None
    power_of_two = 1
    while n % (2 * power_of_two) == 0:
        power_of_two *= 2
    while power_of_two >= 1:
        q = n // power_of_two
        if q <= _MAX_PALEY_ORDER and _paley_kind(q) is not None:
            return q, power_of_two
        power_of_two //= 2
    return None


def _paley_kind(q: int) -> str | None:
    """Which construction builds order q directly: 'one', 'paley1', 'paley2' or None."""
    if q == 1:
        return "one"
    if q > 2 and _prime_power(q - 1) is not None and (q - 1) % 4 == 3:
        return "paley1"
    if q % 2 == 0 and q > 4 and _prime_power(q // 2 - 1) is not None and (q // 2 - 1) % 4 == 1:
        return "paley2"
    return None


def _sylvester(n: int) -> torch.Tensor:
    """Sylvester's Hadamard matrix of order n = 2^k (int8)."""
    h = torch.ones(1, 1, dtype=torch.int8)  # (1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)  # (2m, 2m)
    return h


def _paley(q: int) -> torch.Tensor:
    """Hadamard matrix of order q built by Paley I or II (int64)."""
    kind = _paley_kind(q)
    if kind == "one":
        return torch.ones(1, 1, dtype=torch.int64)
    if kind == "paley1":
        return _paley_one(q - 1)
    return _paley_two(q // 2 - 1)


def _paley_one(p: int) -> torch.Tensor:
    """Paley I, order p+1 for p ≡ 3 (mod 4): H = I + [[0, 1ᵀ], [−1, Q]] with Q skew."""
    jacobsthal = _jacobsthal(p)  # (p, p)
    skew = torch.zeros(p + 1, p + 1, dtype=torch.int64)  # (p+1, p+1)
    skew[0, 1:] = 1
    skew[1:, 0] = -1
    skew[1:, 1:] = jacobsthal
    return skew + torch.eye(p + 1, dtype=torch.int64)


def _paley_two(p: int) -> torch.Tensor:
    """Paley II, order 2(p+1) for p ≡ 1 (mod 4), from the symmetric conference matrix C."""
    conference = torch.zeros(p + 1, p + 1, dtype=torch.int64)  # (p+1, p+1)
    conference[0, 1:] = 1
    conference[1:, 0] = 1
    conference[1:, 1:] = _jacobsthal(p)
    plus = torch.tensor([[1, 1], [1, -1]], dtype=torch.int64)
    minus = torch.tensor([[1, -1], [-1, -1]], dtype=torch.int64)
    eye = torch.eye(p + 1, dtype=torch.int64)
    return torch.kron(conference, minus) + torch.kron(eye, plus)  # (2p+2, 2p+2)


def _jacobsthal(p: int) -> torch.Tensor:
    """Q[i, j] = χ(a_i − a_j), χ the quadratic character of the finite field GF(p)."""
    field = _FiniteField(p)
    squares = {field.mul(a, a) for a in range(1, p)}
    q = torch.zeros(p, p, dtype=torch.int64)  # (p, p)
    for i in range(p):
        for j in range(p):
            diff = field.sub(i, j)
            if diff:
                q[i, j] = 1 if diff in squares else -1
    return q


def _prime_power(n: int) -> tuple[int, int] | None:
    """Return (prime, exponent) when n = prime^exponent, else None."""
    if n < 2:
        return None
    prime = next(f for f in range(2, n + 1) if n % f == 0)
    exponent = 0
    while n % prime == 0:
        n //= prime
        exponent += 1
    return (prime, exponent) if n == 1 else None


class _FiniteField:
    """GF(prime^k); elements are ints whose base-prime digits are polynomial coefficients."""

    def __init__(self, order: int) -> None:
        self.prime, self.degree = _prime_power(order)
        self.modulus = _irreducible(self.prime, self.degree)  # monic, low→high coefficients

    def _digits(self, a: int) -> list[int]:
        return [(a // self.prime**i) % self.prime for i in range(self.degree)]

    def _number(self, digits: list[int]) -> int:
        return sum(c * self.prime**i for i, c in enumerate(digits))

    def sub(self, a: int, b: int) -> int:
        """a − b, coefficient-wise modulo the prime."""
        da, db = self._digits(a), self._digits(b)
        return self._number([(x - y) % self.prime for x, y in zip(da, db)])

    def mul(self, a: int, b: int) -> int:
        """a · b, polynomial product reduced modulo the irreducible modulus."""
        product = _poly_mul(self._digits(a), self._digits(b), self.prime)
        return self._number(_poly_mod(product, self.modulus, self.prime)[: self.degree])


def _poly_mul(a: list[int], b: list[int], prime: int) -> list[int]:
    out = [0] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            out[i + j] = (out[i + j] + x * y) % prime
    return out


def _poly_mod(a: list[int], monic: list[int], prime: int) -> list[int]:
    """Remainder of a modulo a monic polynomial, padded to len(monic) − 1 coefficients."""
    a = list(a)
    deg = len(monic) - 1
    for top in range(len(a) - 1, deg - 1, -1):
        factor = a[top]
        if factor:
            for i, c in enumerate(monic):
                a[top - deg + i] = (a[top - deg + i] - factor * c) % prime
    return (a + [0] * deg)[:deg]


def _irreducible(prime: int, degree: int) -> list[int]:
    """First monic irreducible polynomial of the given degree over GF(prime) (brute force)."""
    if degree == 1:
        return [0, 1]
    for code in range(prime**degree):
        candidate = [(code // prime**i) % prime for i in range(degree)] + [1]
        if not any(_divides(f, candidate, prime) for f in _monics_up_to(prime, degree // 2)):
            return candidate
    raise ValueError(f"no irreducible polynomial of degree {degree} over GF({prime})")


def _monics_up_to(prime: int, max_degree: int):
    for deg in range(1, max_degree + 1):
        for code in range(prime**deg):
            yield [(code // prime**i) % prime for i in range(deg)] + [1]


def _divides(factor: list[int], poly: list[int], prime: int) -> bool:
    return not any(_poly_mod(poly, factor, prime))
