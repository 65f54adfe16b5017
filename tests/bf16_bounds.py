"""How far a bfloat16 result may lie from the exact one, from the arithmetic alone.

A bfloat16 computation stores each value it computes with bf16's 8 significant bits.
oneDNN rounds to nearest, off by at most half an ulp: 2^-8 of the value, bf16's unit
roundoff. TF's Eigen matmul kernels (which run bf16 products where oneDNN does not,
as on AVX2-only cores) truncate, off by less than one ulp. Both are faithful
roundings, so a rounding of v costs less than 2^-7 |v|. Products accumulate in
float32: K terms add at most K 2^-24 times the sum of their magnitudes.

`Bounded` runs a computation on the exact (float64) values and carries, beside each,
the most the bf16 computation's value can differ from it: each op passes its operands'
errors on through the absolute value of its derivative and adds its own rounding
(Wilkinson's running error analysis). The result is a first-order bound, widened by
1 / (1 - n 2^-7) for the n roundings on the longest path, element by element.
A computation that accumulates in bfloat16 is off by about sqrt(K) roundings of the
partial sums, far more than this allows (tests/test_layers.py checks that it would fail).

It is a worst case, so it says something for one product and what follows it
elementwise (a projection, the MLP's first map). Through a whole block each product's
cancellations multiply it, and it soon exceeds the values themselves. There
`assert_as_accurate` compares two bf16 computations of the same function by their
errors' spread instead: hundreds of roundings, each within 2^-8 of its value, add
up like random errors, not like the worst case.
"""

import numpy as np
import tensorflow as tf

BF16_UNIT_ROUNDOFF = 2.0 ** -8
FAITHFUL = 2 * BF16_UNIT_ROUNDOFF  # one bf16 ulp, relative: the most a faithful rounding costs
F32_UNIT_ROUNDOFF = 2.0 ** -24


class Bounded:
    """An exact value (float64) and the most its bf16 computation can be off by.

    Args:
      value: the exact value.
      error: elementwise bound on the error (default 0: an operand the computation
        holds exactly, i.e. representable in bfloat16).
      roundings: the most roundings on any path that led here.
    """

    def __init__(self, value, error=None, roundings=0):
        self.value = tf.convert_to_tensor(np.asarray(value, np.float64))
        self.error = tf.zeros_like(self.value) if error is None else error
        self.roundings = roundings

    def rounded(self):
        """This value, stored in bfloat16."""
        return Bounded(self.value, self.error + FAITHFUL * tf.abs(self.value), self.roundings + 1)

    def map(self, fn):
        """A reshape or transpose: the same `fn` of the value and of the error."""
        return Bounded(fn(self.value), fn(self.error), self.roundings)

    def __add__(self, other):
        other = _bounded(other)
        return Bounded(self.value + other.value, self.error + other.error,
                       max(self.roundings, other.roundings)).rounded()

    def __mul__(self, other):
        other = _bounded(other)
        error = (tf.abs(self.value) * other.error + self.error * tf.abs(other.value)
                 + self.error * other.error)
        return Bounded(self.value * other.value, error, max(self.roundings, other.roundings)).rounded()

    def __matmul__(self, other):
        """A product over the last axis, accumulated in float32, stored in bfloat16."""
        a, b = self, _bounded(other)
        accumulation = a.value.shape[-1] * F32_UNIT_ROUNDOFF * (tf.abs(a.value) @ tf.abs(b.value))
        error = tf.abs(a.value) @ b.error + a.error @ tf.abs(b.value) + a.error @ b.error + accumulation
        return Bounded(a.value @ b.value, error, max(a.roundings, b.roundings)).rounded()

    def elementwise(self, fn):
        """`fn` of each element, computed in float32 and stored in bfloat16; its slope is
        taken at the ends and middle of each element's interval."""
        xs = [self.value - self.error, self.value, self.value + self.error]
        slopes = []
        for x in xs:
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = fn(x)
            slopes.append(tf.abs(tape.gradient(y, x)))
        return Bounded(fn(self.value), tf.reduce_max(slopes, 0) * self.error, self.roundings).rounded()

    def bound(self):
        """(exact value, elementwise bound on the bf16 result's distance from it)."""
        widening = 1 / (1 - self.roundings * FAITHFUL)
        return self.value.numpy(), self.error.numpy() * widening


def _bounded(x):
    return x if isinstance(x, Bounded) else Bounded(x)


def times_constant(constant, x):
    """`constant * x` where the computation holds `constant` in bfloat16: the
    constant's rounding moves the product as much as rounding the product does."""
    product = Bounded(constant * x.value, abs(constant) * x.error, x.roundings).rounded()
    return product.rounded()


def gelu(x, approximate):
    """`tf.nn.gelu` as TF computes it op by op in bfloat16 (the most rounding; a fused
    kernel computes it in float32 and rounds once)."""
    if approximate:
        cube = x.elementwise(lambda v: v ** 3)
        inner = x + times_constant(0.044715, cube)
        t = times_constant(np.sqrt(2 / np.pi), inner).elementwise(tf.tanh)
    else:
        t = times_constant(1 / np.sqrt(2), x).elementwise(tf.math.erf)
    return x.map(lambda v: 0.5 * v) * (t + 1.0)  # halving is exact


SIGMAS = 5.0  # a computation as accurate as the plain one fails less than once in a million


def assert_as_accurate(candidate, plain, exact, what="result"):
    """`candidate`, one bf16 computation of a function, is no less accurate than `plain`,
    another, against `exact` (the function in float32 or float64, errors 2^16 smaller).

    The root-mean-square error over n elements estimates the errors' spread; for two
    computations whose roundings scatter alike, the log of the ratio of their RMS errors
    has a standard deviation of about 1/sqrt(n) (half the log of an F(n, n) variable).
    `candidate` may round once more than `plain` (a fast path that stores a bf16
    intermediate the plain one keeps in float32); independent errors add in quadrature,
    so its RMS error may reach exp(SIGMAS / sqrt(n)) sqrt(e^2 + r^2), with e `plain`'s
    and r = 2^-8 RMS(exact), one such rounding.

    Args:
      candidate, plain, exact: arrays of one shape.
      what: named in the failure message.
    """
    exact = np.asarray(exact, np.float64)
    candidate, plain = (np.asarray(a, np.float64) for a in (candidate, plain))
    assert candidate.shape == plain.shape == exact.shape, (candidate.shape, plain.shape, exact.shape)

    def rms(a):
        return float(np.sqrt(np.mean(np.square(a))))

    ours, theirs = rms(candidate - exact), rms(plain - exact)
    allowed = np.exp(SIGMAS / np.sqrt(exact.size)) * np.hypot(theirs, BF16_UNIT_ROUNDOFF * rms(exact))
    assert ours <= allowed, (
        f"{what}: RMS error {ours:.4g} against the exact values, where the plain bf16 computation's "
        f"is {theirs:.4g} and {allowed:.4g} is allowed ({exact.size} elements)")


def assert_within(actual, expected):
    """Every element of `actual` lies within `expected`'s bound (`(exact, bound)`, from
    `Bounded.bound`) of its exact value; says where and by how much where not."""
    exact, bound = expected
    actual = np.asarray(actual, np.float64)
    assert actual.shape == exact.shape, (actual.shape, exact.shape)
    excess = np.abs(actual - exact) - bound
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    assert excess[worst] <= 0, (
        f"{int((excess > 0).sum())} of {excess.size} elements beyond the bf16 bound; worst at {worst}: "
        f"{actual[worst]} against {exact[worst]}, off by {abs(actual[worst] - exact[worst]):.4g} "
        f"where the arithmetic allows {bound[worst]:.4g}")
