#!/usr/bin/env python3
"""Fits the rational function behind vec_erf (kernels/common/vec_exp.h).

erf(x) = x R(x^2) on |x| <= 4, R = P / Q with P of degree 5 and Q of degree 5 (Q(0) = 1),
chosen for the least maximum relative error: linearised least squares (P - f Q weighted by
1 / (f Q) of the previous step, Sanathanan-Koerner) with Lawson's reweighting towards minimax.
Prints the largest relative error on the fitting points and the coefficients, lowest first.
Needs numpy and mpmath (pip install numpy mpmath).
"""
import sys

import mpmath as mp
import numpy as np


def fit(num_degree=5, den_degree=5, limit=4.0, points=6000, iterations=60):
    mp.mp.dps = 30
    xs = (np.cos(np.linspace(np.pi, 0, points)) + 1) * limit / 2  # Chebyshev points on [0, limit]
    xs[0] = 1e-6
    f = np.array([float(mp.erf(mp.mpf(x)) / mp.mpf(x)) for x in xs])
    scale = limit * limit  # fit in t = x^2 / scale, in [0, 1], for conditioning
    t = xs * xs / scale
    weight, q_prev, best = np.ones(points), np.ones(points), None
    for it in range(iterations):
        a = np.zeros((points, num_degree + 1 + den_degree))
        for k in range(num_degree + 1):
            a[:, k] = t**k
        for k in range(1, den_degree + 1):
            a[:, num_degree + k] = -f * t**k
        row_scale = np.sqrt(weight) / (f * q_prev)
        sol, *_ = np.linalg.lstsq(a * row_scale[:, None], f * row_scale, rcond=None)
        p = sol[: num_degree + 1]
        q = np.concatenate([[1.0], sol[num_degree + 1 :]])
        pv = sum(p[k] * t**k for k in range(num_degree + 1))
        qv = sum(q[k] * t**k for k in range(den_degree + 1))
        err = (pv / qv - f) / f
        worst = np.max(np.abs(err))
        if best is None or worst < best[0]:
            best = (worst, p.copy(), q.copy())
        q_prev = qv
        if it > 5:
            weight = weight * np.abs(err) ** 0.5
            weight /= weight.sum()
    worst, p, q = best
    # back to powers of z = x^2
    return worst, [p[k] / scale**k for k in range(len(p))], [q[k] / scale**k for k in range(len(q))]


if __name__ == "__main__":
    degrees = [int(a) for a in sys.argv[1:3]] or [5, 5]
    worst, p, q = fit(*degrees)
    print(f"largest relative error {worst:.3e}")
    print("P", ", ".join(f"{c:.17e}" for c in p))
    print("Q", ", ".join(f"{c:.17e}" for c in q))
