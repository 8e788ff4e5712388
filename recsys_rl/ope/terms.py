"""Estimates written as sums of per-row terms, so that resampling an estimate is a weighted sum.

Every estimator here, single-decision or sequential, has the form

    value[s] = sum_p  (sum_i numerator[i, p, s]) / (sum_i denominator[i, p])

over rows i and a few parts p: a plain mean is one part with denominator 1 per row, a self-normalised
estimator one part with the weights as denominator, SNDR two parts, weighted per-decision IS one part per
step. A bootstrap resample with counts c_i is then the same formula with every sum weighted by c_i, and a
jackknife leave-block-out is the same formula with the block's sums subtracted: only column sums are
ever needed, which is what makes 200 resamples of a million rows cheap (``recsys_rl.ope.intervals``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RatioTerms:
    """Per-row terms of an estimate; ``value()`` is the estimate, one number per signal."""

    numerator: np.ndarray  # (n, P, S)
    denominator: np.ndarray  # (n, P)

    def __post_init__(self) -> None:
        if self.numerator.ndim != 3 or self.denominator.shape != self.numerator.shape[:2]:
            raise ValueError(
                f"RatioTerms: numerator {self.numerator.shape} should be (n, P, S) and denominator "
                f"{self.denominator.shape} (n, P)"
            )

    @classmethod
    def mean(cls, values: np.ndarray) -> RatioTerms:
        """The terms of a plain mean of per-row values (n, S)."""
        return cls(values[:, None, :], np.ones((values.shape[0], 1)))

    @property
    def parts(self) -> int:
        return int(self.numerator.shape[1])

    @property
    def signals(self) -> int:
        return int(self.numerator.shape[2])

    @property
    def width(self) -> int:
        """Columns of ``flat()``: every part's numerators, then every part's denominator."""
        return self.parts * (self.signals + 1)

    def flat(self) -> np.ndarray:
        """The terms as one (n, width) matrix, the layout ``ratio_value`` reads."""
        n = self.numerator.shape[0]
        return np.concatenate([self.numerator.reshape(n, -1), self.denominator], axis=1)

    def sum_by(self, starts: np.ndarray) -> RatioTerms:
        """Terms summed over consecutive runs of rows beginning at ``starts`` (e.g. sessions)."""
        return RatioTerms(
            np.add.reduceat(self.numerator, starts, axis=0), np.add.reduceat(self.denominator, starts, axis=0)
        )

    def value(self) -> np.ndarray:
        return ratio_value(self.flat().sum(axis=0), self.parts, self.signals)


def ratio_value(sums: np.ndarray, parts: int, signals: int) -> np.ndarray:
    """Estimates (..., S) from column sums (..., parts * (signals + 1)) laid out as ``RatioTerms.flat``.

    A part whose denominator sums to zero (no row of a group drawn in a resample) gives NaN.
    """
    numerator = sums[..., : parts * signals].reshape(*sums.shape[:-1], parts, signals)
    denominator = sums[..., parts * signals :]
    with np.errstate(divide="ignore", invalid="ignore"):
        return (numerator / denominator[..., None]).sum(axis=-2)
