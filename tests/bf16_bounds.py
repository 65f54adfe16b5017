"""How far a bfloat16 result may lie from the exact one, from the arithmetic alone.

A bfloat16 computation stores each value it computes with bf16's 8 significant bits.
oneDNN rounds to nearest, off by at most half an ulp: 2^-8 of the value, bf16's unit
roundoff. TF's Eigen matmul kernels (which run bf16 products where oneDNN does not,
as on AVX2-only cores) truncate, off by less than one ulp. Both are faithful
roundings, so a rounding of v costs less than 2^-7 |v|. Products accumulate in
float32: K terms add at most K 2^-24 times the sum of their magnitudes.

To first order the error of a result y is then the sum over each rounded value v of
|dy/dv| 2^-7 |v|, plus |dy/dp| K 2^-24 (|a| @ |b|) for each product p = a @ b.
`error_bound` evaluates that sum exactly, element by element, by differentiating the
float64 reference. A computation that accumulates in bfloat16 is off by about sqrt(K)
roundings of the partial sums, far more than this allows.
"""

import numpy as np
import tensorflow as tf

BF16_UNIT_ROUNDOFF = 2.0 ** -8
FAITHFUL = 2 * BF16_UNIT_ROUNDOFF  # one bf16 ulp, relative: the most a faithful rounding costs
F32_UNIT_ROUNDOFF = 2.0 ** -24


class Roundings:
    """What `error_bound`'s computation calls at each place bf16 arithmetic rounds."""

    def __init__(self, tape):
        self._tape = tape
        self.points = []  # (perturbation, the most a rounding there can move the value)

    def _point(self, value, size):
        perturbation = tf.zeros_like(value)
        self._tape.watch(perturbation)
        self.points.append((perturbation, size))
        return value + perturbation

    def rounded(self, value):
        """`value`, which the computation stores in bfloat16."""
        return self._point(value, FAITHFUL * tf.abs(value))

    def product(self, a, b):
        """`a @ b` (`[N, K] @ [K, M]`), accumulated in float32 and stored in bfloat16."""
        accumulation = a.shape[-1] * F32_UNIT_ROUNDOFF * (tf.abs(a) @ tf.abs(b))
        return self.rounded(self._point(a @ b, accumulation))

    def times_constant(self, constant, value):
        """`constant * value` where the computation holds `constant` in bfloat16: its
        rounding moves the product as much as a rounding of the product does."""
        return self.rounded(self._point(constant * value, FAITHFUL * tf.abs(constant * value)))


def error_bound(fn, *operands):
    """The exact result of a bf16 computation and the most its bf16 result may differ.

    Args:
      fn: `fn(r, *operands)`, the computation written on float64 tensors, with
        `r.rounded(v)`, `r.product(a, b)` and `r.times_constant(c, v)` (a `Roundings`)
        wherever the bf16 computation rounds. Every value so marked has the result's
        shape: what follows it is elementwise, so each element's bound is its own.
      *operands: arrays already representable in bfloat16 (as the computation's inputs).

    Returns:
      (exact result, elementwise bound on |bf16 result - exact result|), as float64
      numpy arrays of the result's shape.
    """
    with tf.GradientTape(persistent=True) as tape:
        r = Roundings(tape)
        y = fn(r, *(tf.constant(np.asarray(o, np.float64)) for o in operands))
        total = tf.reduce_sum(y)
    for perturbation, _ in r.points:
        assert perturbation.shape == y.shape, "mark only values of the result's shape"
    grads = tape.gradient(total, [p for p, _ in r.points])
    bound = sum(tf.abs(g) * size for g, (_, size) in zip(grads, r.points))
    # The first-order terms, widened by the second-order ones (products of two roundings).
    return y.numpy(), bound.numpy() * (1 + FAITHFUL * len(r.points))


def gelu(r, x, approximate):
    """`tf.nn.gelu(x, approximate)` as TF computes it op by op in bfloat16 (the widest
    rounding; a fused kernel computes it in float32 and rounds once)."""
    if approximate:
        cube = r.rounded(x ** 3)
        inner = r.rounded(x + r.times_constant(0.044715, cube))
        t = r.rounded(tf.tanh(r.times_constant(np.sqrt(2 / np.pi), inner)))
    else:
        t = r.rounded(tf.math.erf(r.times_constant(1 / np.sqrt(2), x)))
    return r.rounded(0.5 * x * r.rounded(1.0 + t))


def assert_within(actual, exact, bound):
    """Every element of `actual` lies within `bound` of `exact`; says by how much where not."""
    actual = np.asarray(actual, np.float64)
    excess = np.abs(actual - exact) - bound
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    assert excess[worst] <= 0, (
        f"{int((excess > 0).sum())} of {excess.size} elements beyond the bf16 bound; worst at {worst}: "
        f"{actual[worst]} against {exact[worst]}, off by {abs(actual[worst] - exact[worst]):.4g} "
        f"where the arithmetic allows {bound[worst]:.4g}")
