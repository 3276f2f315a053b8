"""Coarse per-op profiles for Auto-MAP's online-inference pipeline planner (spec ``automap.md`` §10.2-10.3).

A model with ``n`` ops is described by three per-op arrays: ``C`` (compute time per op, seconds),
``A`` (activation bytes crossing a cut placed after each op) and ``W`` (parameter bytes per op).
The DQN sees them only after the exact §10.2 transform, implemented by :func:`coarsen`:

1. prefix sums ``C' = cumsum(C)``, ``W' = cumsum(W)``; ``A`` is left as is. The sums are inclusive,
   so ``C'[i]`` is the compute of ops ``0..i``, the part left of a cut placed after op ``i``, and
   ``A[i]`` is what crosses that same cut. (The spec's "first i instructions" is read this way.)
2. coarsening to ``G`` (128) evenly spaced points, the same points for all three arrays;
3. one shared scale ``MAX = max(C'', A'', W'')``, so all three land in ``[0, 1]`` and keep their
   relative magnitudes (a per-array scale would hide whether compute or communication dominates).

Consequences the planner relies on: ``C*`` and ``W*`` are non-decreasing and end at the model's total
compute / parameter size over ``MAX``; ``A*`` is sampled pointwise, so it is neither summed nor
smoothed, and activation peaks between two sampled points are not seen. Exactly the array holding
``MAX`` reaches 1.0 (barring exact ties).

:func:`synthetic_profile` draws the §10.3 synthetic training profiles. Pure numpy: no ray, no torch.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np

DISTRIBUTIONS = ("uniform", "normal", "binomial")
MIXED = "mixed"
DEFAULT_GRANULARITY = 128  # §10.2: "take 128 evenly spaced points"

# Our choices for §10.3, where the paper gives no parameters ([GAP]).
NORMAL_MEAN, NORMAL_STD = 0.5, 0.15  # clipped to [0, 1]; clipping is symmetric, so the mean stays 0.5
BINOMIAL_TRIALS, BINOMIAL_P = 20, 0.3  # divided by the trial count: values k/20, mean 0.3


@dataclass(frozen=True, eq=False)
class CoarseProfile:
    """The normalised profile ``(C*, A*, W*)`` the DQN sees, plus what maps it back to the model.

    ``compute``, ``activation`` and ``params`` are dimensionless (original units over ``scale``);
    ``scale`` is the shared ``MAX`` in the inputs' own units, since the three arrays share it.
    ``source_index[k]`` is the original op index coarse point ``k`` was taken from, so a cut the
    planner places at point ``k`` means "cut after op ``source_index[k]``". The arrays are read-only
    so the frozen profile really is immutable; ``eq=False`` because ``==`` on arrays is elementwise.
    """

    compute: np.ndarray
    activation: np.ndarray
    params: np.ndarray
    scale: float
    source_index: np.ndarray

    def __post_init__(self) -> None:
        fields = {"compute": self.compute, "activation": self.activation, "params": self.params,
                  "source_index": self.source_index}
        length = len(self.compute)
        for name, value in fields.items():
            arr = np.array(value, dtype=np.int64 if name == "source_index" else np.float64)
            if arr.ndim != 1 or len(arr) != length:
                raise ValueError(f"{name} has shape {arr.shape}, must be 1-D of length {length} like compute")
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        object.__setattr__(self, "scale", float(self.scale))

    @property
    def granularity(self) -> int:
        """Number of coarse points ``G``: the only positions where the planner may cut."""
        return len(self.compute)


def _as_profile_array(name: str, value: object) -> np.ndarray:
    """Validate one raw per-op array: 1-D, non-empty, real, finite, non-negative."""
    if np.iscomplexobj(value):
        raise ValueError(f"{name} is complex, must be real, finite and non-negative")
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} is not numeric ({exc}), must be a 1-D array of real numbers") from exc
    if arr.ndim != 1:
        raise ValueError(f"{name} has shape {arr.shape}, must be 1-D (one value per op)")
    if arr.size == 0:
        raise ValueError(f"{name} is empty, must hold one value per op")
    if not np.all(np.isfinite(arr)):
        bad = np.flatnonzero(~np.isfinite(arr))[:5].tolist()
        raise ValueError(f"{name} has NaN or infinite values at {bad}, must be finite")
    if np.any(arr < 0):
        bad = np.flatnonzero(arr < 0)[:5].tolist()
        raise ValueError(f"{name} has negative values at {bad}, must be >= 0")
    return arr


def _check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    """An integer (not bool) in ``[low, high]``; ``high=None`` means unbounded."""
    allowed = f"an int in [{low}, {high}]" if high is not None else f"an int >= {low}"
    if isinstance(value, bool):
        raise ValueError(f"{name} is {value!r}, must be {allowed}")
    try:
        ivalue = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} is {value!r}, must be {allowed}") from None
    if ivalue < low or (high is not None and ivalue > high):
        raise ValueError(f"{name} is {ivalue}, must be {allowed}")
    return ivalue


def coarse_indices(n_ops: int, granularity: int = DEFAULT_GRANULARITY) -> np.ndarray:
    """The ``granularity`` evenly spaced op indices: ``rint(linspace(0, n_ops - 1, G))``.

    Both ends are always included (the last point is the whole model, so ``C*[-1]`` is the total).
    ``np.rint`` rounds half to even. For ``n_ops >= G`` the step is >= 1, so the indices are strictly
    increasing (two reals more than 1 apart never round to the same int; a step of exactly 1 gives ints).
    """
    n_ops = _check_int("n_ops", n_ops, 1)
    granularity = _check_int("granularity", granularity, 2)
    if granularity > n_ops:
        raise ValueError(f"granularity is {granularity}, must be an int in [2, {n_ops}] "
                         "(at most the number of ops)")
    return np.rint(np.linspace(0, n_ops - 1, granularity)).astype(np.int64)


def coarsen(compute_s: object, activation_bytes: object, param_bytes: object,
            granularity: int = DEFAULT_GRANULARITY) -> CoarseProfile:
    """The exact §10.2 transform: prefix-sum C and W, sample G points, divide by one shared MAX.

    ``compute_s[i]`` is op ``i``'s compute time, ``activation_bytes[i]`` the bytes crossing a cut after
    op ``i``, ``param_bytes[i]`` op ``i``'s parameter size; all 1-D, equally long, finite and >= 0.
    Units only need to be consistent within each array: the shared scale makes the result dimensionless.
    Raises ValueError naming the bad field, when ``granularity`` is outside ``[2, n]``, or when
    ``MAX`` is 0 (all-zero profile: nothing to normalise).
    """
    raw = {"compute_s": compute_s, "activation_bytes": activation_bytes, "param_bytes": param_bytes}
    arrays = {name: _as_profile_array(name, value) for name, value in raw.items()}
    n = len(arrays["compute_s"])
    for name in ("activation_bytes", "param_bytes"):
        if len(arrays[name]) != n:
            raise ValueError(f"{name} has length {len(arrays[name])}, must equal len(compute_s) = {n}")
    idx = coarse_indices(n, granularity)
    compute = np.cumsum(arrays["compute_s"])[idx]
    activation = arrays["activation_bytes"][idx]
    params = np.cumsum(arrays["param_bytes"])[idx]
    scale = float(max(compute.max(), activation.max(), params.max()))
    if scale == 0.0:
        raise ValueError("compute_s, activation_bytes and param_bytes are all zero at the sampled points, "
                         "so the shared scale MAX is 0; at least one must be positive")
    return CoarseProfile(compute=compute / scale, activation=activation / scale, params=params / scale,
                         scale=scale, source_index=idx)


def draw_raw(rng: np.random.Generator, n: int, distribution: str) -> np.ndarray:
    """``n`` floats in ``[0, 1]`` from one of :data:`DISTRIBUTIONS` (parameters are our choice, see top)."""
    if distribution == "uniform":
        return rng.uniform(0.0, 1.0, n)
    if distribution == "normal":
        return np.clip(rng.normal(NORMAL_MEAN, NORMAL_STD, n), 0.0, 1.0)
    if distribution == "binomial":
        return rng.binomial(BINOMIAL_TRIALS, BINOMIAL_P, n) / BINOMIAL_TRIALS
    raise ValueError(f"distribution is {distribution!r}, must be one of {sorted(DISTRIBUTIONS)}")


def synthetic_profile(rng: np.random.Generator, n_ops: int = 1024, distribution: str = "uniform",
                      granularity: int = DEFAULT_GRANULARITY) -> CoarseProfile:
    """One §10.3 synthetic environment: three raw ``[0, 1]`` arrays of ``n_ops`` through :func:`coarsen`.

    The raw arrays are drawn in the order compute, activation, params, so a profile is a pure function
    of the generator's state. ``distribution="mixed"`` first picks one of :data:`DISTRIBUTIONS` per array
    (``rng.integers``), then draws. ``n_ops=1024`` is our choice (the raw length is a [GAP] in §10.3).
    Note that with equal-range draws the prefix sums dominate MAX, so ``A*`` is about ``1 / n_ops``.
    """
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng is {type(rng).__name__}, must be a numpy.random.Generator (default_rng)")
    allowed = sorted((*DISTRIBUTIONS, MIXED))
    if distribution not in allowed:
        raise ValueError(f"distribution is {distribution!r}, must be one of {allowed}")
    granularity = _check_int("granularity", granularity, 2)
    n_ops = _check_int("n_ops", n_ops, granularity)
    if distribution == MIXED:
        kinds = [DISTRIBUTIONS[i] for i in rng.integers(len(DISTRIBUTIONS), size=3)]
    else:
        kinds = [distribution] * 3
    compute, activation, params = (draw_raw(rng, n_ops, kind) for kind in kinds)
    return coarsen(compute, activation, params, granularity)
