"""One rule for the tolerance of every numerical comparison in the tests.

Two computations of the same value that differ only in rounding (another CPU and its BLAS kernels,
another thread count, a batch of sequences versus one sequence at a time) agree to about

    eps(dtype) · sqrt(n)   relative,

where eps is the machine epsilon of the dtype the value was *computed* in and n the length of the
longest sum (dot product, reduction) behind it: the rounding errors of a sum of n terms grow like a
random walk. So:

- values computed in float32 (anything that went through a model's forward pass, even when it was
  cast to float64 afterwards) get ``float32_tol(n)``: SAFETY · eps32 · sqrt(n), never below 1e-6.
  SAFETY covers the few reductions stacked on each other (the layers of a tiny model) and was not
  tuned on any machine: the largest difference measured in the influence tests (a padded batch
  versus one sequence at a time, on an Intel Xeon) is 3e-9, some 3000 times below TINY_MODEL_TOL;
- values computed in float64 from float64 inputs get ``FLOAT64_REL``, and so do two float64 results
  of the very same float32 ops (same machine, same thread count), where only float64 round-off remains;
- a linear solve amplifies the relative round-off of its inputs by at most their condition number:
  its result gets the tolerance of its inputs times cond;
- a value near zero is compared with an absolute tolerance on the scale of the quantities it was
  computed from (1 for a cosine, the largest entry for a matrix), never with a bare 1e-9.

Bitwise comparisons (``torch.equal``, ``rtol=atol=0``) are kept only where the code promises the same
bits on one machine (same process, same thread count), and each says so in a comment.
"""

from __future__ import annotations

import math

import torch

from tests.tiny import VOCAB

FLOAT32_EPS = torch.finfo(torch.float32).eps  # 1.19e-7
FLOAT64_REL = 1e-10  # float64 round-off (eps 2.2e-16) with ~1e6 of headroom for sums and solves
SAFETY = 10.0  # stacked reductions (layers) on top of one sum's random walk
FLOAT32_FLOOR = 1e-6  # no float32 value is compared tighter than this


def float32_tol(n: int = 1) -> float:
    """Relative tolerance for a value whose longest float32 reduction sums ``n`` terms."""
    return max(FLOAT32_FLOOR, SAFETY * FLOAT32_EPS * math.sqrt(n))


# The longest reduction in a tiny model's forward pass (tests/tiny.py: hidden 32, MLP 64, sequences
# of at most 64 tokens) is the vocabulary softmax: about 1.2e-5.
TINY_MODEL_TOL = float32_tol(VOCAB)


def assert_close_on_scale(got: torch.Tensor, want: torch.Tensor, tol: float) -> None:
    """Relative ``tol`` per entry, and ``tol`` times the largest entry for entries near zero (the
    off-diagonal of a Gram matrix is a difference of large terms: its round-off is on that scale)."""
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * float(want.abs().max()))
