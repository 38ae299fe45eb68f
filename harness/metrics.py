"""Output-comparison metrics, named as QAIRT's accuracy verifiers name them."""

from __future__ import annotations

import numpy as np


def as_flat(x) -> np.ndarray:
    """Return x (a tensor, or a list of tensors such as one per sample) as one flat float64 vector (x itself when it
    is one already): flatten once, then pass it to several metrics."""
    if isinstance(x, (list, tuple)):
        return np.concatenate([np.ravel(a) for a in x], dtype=np.float64) if x else np.zeros(0)  # converted once
    return np.asarray(x, dtype=np.float64).ravel()


def cosine_similarity(reference, test) -> float:
    """Return the cosine similarity of two tensors (or lists of tensors), flattened; 1.0 for two zeros."""
    a, b = as_flat(reference), as_flat(test)
    return cosine_of(a, b, np.linalg.norm(a), np.linalg.norm(b))


def cosine_of(a: np.ndarray, b: np.ndarray, norm_a, norm_b) -> float:
    """Return cosine_similarity of two flat vectors whose norms (np.linalg.norm) are known, so that a vector
    compared with several others is normed once."""
    if norm_a == 0 and norm_b == 0:
        return 1.0
    if norm_a == 0 or norm_b == 0:
        return 0.0
    return float(np.dot(a, b) / (norm_a * norm_b))


def sqnr_db(reference, test) -> float:
    """Return 10·log10(mean(reference²) / mse) in dB; +inf when identical."""
    a, b = as_flat(reference), as_flat(test)
    return sqnr_of(mean_square(a), mean_square(a - b) if a.size else 0.0)


def mean_square(a: np.ndarray) -> float:
    """Return the mean of a flat vector's squares (0.0 for an empty one): sqnr_of's signal, or its error of a - b."""
    return float(np.mean(a ** 2)) if a.size else 0.0


def sqnr_of(signal: float, mse: float) -> float:
    """Return sqnr_db from a reference's mean square (signal) and the mean squared error; +inf when mse is 0."""
    if mse == 0:
        return float("inf")
    if signal == 0:
        return float("-inf")
    return float(10 * np.log10(signal / mse))


def mean_abs_error(reference, test) -> float:
    """Return the mean absolute difference."""
    a, b = as_flat(reference), as_flat(test)
    return mean_abs(a - b) if a.size else 0.0


def mean_abs(a: np.ndarray) -> float:
    """Return the mean of a flat vector's absolute values (mean_abs_error of the difference a is)."""
    return float(np.mean(np.abs(a))) if a.size else 0.0


def max_abs_diff(reference, test) -> float:
    """Return the largest absolute difference."""
    a, b = as_flat(reference), as_flat(test)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def is_classifier_output(shape: tuple[int, ...]) -> bool:
    """True for a (batch, classes) or (classes,) output with more than one class."""
    dims = [d for d in shape if d != 1]
    return len(dims) == 1 and dims[0] > 1 and len(shape) <= 2


DECISION_THRESHOLD = 0.5  # a detector's probability at or above it means "detected"


def is_probability_output(values: list[np.ndarray]) -> bool:
    """True when every sample's output is a single value in [0, 1] (a detector's sigmoid probability)."""
    arrays = [np.asarray(v) for v in values]
    return bool(arrays) and all(a.size == 1 and 0.0 <= float(a.ravel()[0]) <= 1.0 for a in arrays)


def top1(logits: np.ndarray) -> int:
    """Return the arg-max class of a classifier output."""
    return int(np.argmax(np.asarray(logits).ravel()))


def sample_sums(reference: list[list[np.ndarray]], test: list[list[np.ndarray]]) -> np.ndarray:
    """Return per sample (one row each) the sums cosine similarity and SQNR are made of: reference·test,
    reference², test², (reference - test)² over the sample's output tensors, so a resample's cosine or SQNR
    is cosine_from_sums / sqnr_from_sums of its rows' total."""
    rows = []
    for ref, out in zip(reference, test):
        a, b = as_flat(list(ref)), as_flat(list(out))
        rows.append((float(np.dot(a, b)), float(np.dot(a, a)), float(np.dot(b, b)), float(np.sum((a - b) ** 2))))
    return np.asarray(rows, dtype=np.float64).reshape(-1, 4)


def cosine_from_sums(sums: np.ndarray) -> float:
    """Return the cosine similarity of samples whose sample_sums add up to sums (as cosine_similarity)."""
    dot, aa, bb, _ = (float(x) for x in sums)
    if aa == 0 and bb == 0:
        return 1.0
    if aa == 0 or bb == 0:
        return 0.0
    return dot / float(np.sqrt(aa) * np.sqrt(bb))


def sqnr_from_sums(sums: np.ndarray) -> float:
    """Return the SQNR in dB of samples whose sample_sums add up to sums (as sqnr_db)."""
    _, aa, _, err = (float(x) for x in sums)
    if err == 0:
        return float("inf")
    if aa == 0:
        return float("-inf")
    return float(10 * np.log10(aa / err))
