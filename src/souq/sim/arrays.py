"""The typed numpy arrays the columnar placement (:mod:`souq.sim.columns`) and the
simulator hold: one row per worker (or host), one column per figure."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["Bools", "Floats", "Ints"]

Ints = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]
