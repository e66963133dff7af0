"""Language-model accuracy figures from logits: pure numpy, no model, no file.

A quantised build is judged against a reference (transformers' fp32 model) on held-out text:

- :func:`token_windows` cuts a token stream into evenly spaced, non-overlapping windows;
- :func:`top1_agreement` is the fraction of positions whose next-token choice (argmax, ties to
  the lower id as in ``numpy.argmax`` and the C sampler) is the reference's, over every
  position of every window;
- :func:`perplexity` is exp of the mean negative log-likelihood of each window's next tokens
  (position t predicts token t + 1, so a window of T tokens scores T - 1 of them), pooled over
  the windows; :func:`perplexity_ratio` divides two of them;
- :func:`kl_divergence` is the mean over every position of every window of KL(reference || q),
  the divergence of the next-token distribution from the reference's, in nats (llama.cpp's
  ``llama-perplexity --kl-divergence`` figure).

Log-softmax is computed in float64 whatever the logits' dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import InputError


def token_windows(ids: Sequence[int] | np.ndarray, n_windows: int, length: int) -> np.ndarray:
    """n_windows windows [n_windows, length] (int64) of the stream `ids`, evenly spaced and
    non-overlapping: window i starts at i * (len(ids) // n_windows). InputError when the stream
    holds fewer than n_windows * length tokens."""
    stream = np.asarray(ids, dtype=np.int64).reshape(-1)
    if n_windows < 1 or length < 2:
        raise InputError(f"need >= 1 window of >= 2 tokens, got {n_windows} x {length}")
    if stream.size < n_windows * length:
        raise InputError(
            f"{stream.size} tokens are too few for {n_windows} windows of {length}: pass more "
            f"text, or fewer / shorter windows"
        )
    stride = stream.size // n_windows
    return np.stack([stream[i * stride : i * stride + length] for i in range(n_windows)])


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log softmax over the last axis, float64."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    out: np.ndarray = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return out


def _check_rows(logits: np.ndarray, n: int, what: str) -> np.ndarray:
    arr = np.asarray(logits)
    if arr.ndim != 2 or arr.shape[0] != n:
        raise InputError(f"{what}: logits of shape {arr.shape}, expected [{n}, vocab]")
    return arr


def next_token_nll(logits: np.ndarray, ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Negative log-likelihood [T - 1] (float64) of ids[1:] under logits[:-1] ([T, vocab])."""
    tokens = np.asarray(ids, dtype=np.int64).reshape(-1)
    lp = log_softmax(_check_rows(logits, tokens.size, "next_token_nll")[:-1])
    out: np.ndarray = -lp[np.arange(tokens.size - 1), tokens[1:]]
    return out


def perplexity(
    logits: Sequence[np.ndarray], windows: Sequence[Sequence[int]] | np.ndarray
) -> float:
    """exp(mean next-token NLL) over every predicted position of every window; logits[i] are
    the [T_i, vocab] logits of windows[i]."""
    if len(logits) != len(windows) or not len(windows):
        raise InputError(f"{len(logits)} logit arrays for {len(windows)} windows")
    nll = np.concatenate([next_token_nll(lg, w) for lg, w in zip(logits, windows)])
    return float(np.exp(nll.mean()))


def perplexity_ratio(ppl: float, reference_ppl: float) -> float:
    """ppl / reference_ppl: 1.0 is no loss, 1.01 one per cent worse."""
    return ppl / reference_ppl


def top1_matches(logits: Sequence[np.ndarray], reference: Sequence[np.ndarray]) -> tuple[int, int]:
    """(positions whose argmax equals the reference's, positions) over every window."""
    if len(logits) != len(reference):
        raise InputError(f"{len(logits)} logit arrays for {len(reference)} reference arrays")
    same = total = 0
    for lg, ref in zip(logits, reference):
        r = np.asarray(ref)
        a = _check_rows(lg, r.shape[0], "top1_matches")
        same += int((a.argmax(axis=-1) == r.argmax(axis=-1)).sum())
        total += r.shape[0]
    return same, total


def top1_agreement(logits: Sequence[np.ndarray], reference: Sequence[np.ndarray]) -> float:
    """Fraction of positions (every position of every window) whose next-token choice is the
    reference's."""
    same, total = top1_matches(logits, reference)
    return same / total if total else 1.0


def max_abs_diff(logits: Sequence[np.ndarray], reference: Sequence[np.ndarray]) -> float:
    """Largest |logit - reference logit| over every window."""
    return max(
        float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())
        for a, b in zip(logits, reference)
    )


def kl_divergence(logits: Sequence[np.ndarray], reference: Sequence[np.ndarray]) -> float:
    """Mean over every position of every window of KL(p || q) = sum_v p_v (log p_v - log q_v)
    in nats, p the reference's softmax and q the logits'; 0.0 when they are the same."""
    if len(logits) != len(reference) or not len(reference):
        raise InputError(f"{len(logits)} logit arrays for {len(reference)} reference arrays")
    total = 0.0
    count = 0
    for lg, ref in zip(logits, reference):
        lp = log_softmax(ref)
        lq = log_softmax(_check_rows(lg, lp.shape[0], "kl_divergence"))
        total += float((np.exp(lp) * (lp - lq)).sum())
        count += lp.shape[0]
    return total / count
