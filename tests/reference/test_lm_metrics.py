"""colibri.reference.lm_metrics: the figures of tests/quant/test_trained_accuracy.py and
benchmarks/accuracy_table.py on cases whose answer is known."""

from __future__ import annotations

import math

import numpy as np
import pytest
from colibri.errors import InputError
from colibri.reference.lm_metrics import (
    kl_divergence,
    log_softmax,
    max_abs_diff,
    next_token_nll,
    perplexity,
    perplexity_ratio,
    token_windows,
    top1_agreement,
    top1_matches,
)


def test_token_windows_are_evenly_spaced_and_disjoint() -> None:
    w = token_windows(np.arange(100), 3, 10)
    assert w.dtype == np.int64 and w.shape == (3, 10)
    assert w[:, 0].tolist() == [0, 33, 66]
    assert (w[:, 1:] - w[:, :-1] == 1).all()
    assert token_windows(list(range(20)), 2, 10).tolist() == [
        list(range(10)),
        list(range(10, 20)),
    ]
    with pytest.raises(InputError, match="too few"):
        token_windows(np.arange(19), 2, 10)
    with pytest.raises(InputError):
        token_windows(np.arange(19), 1, 1)


def test_uniform_logits_have_the_vocabulary_as_perplexity() -> None:
    ids = np.array([[1, 2, 3, 0], [3, 3, 1, 2]])
    logits = [np.zeros((4, 5)), np.full((4, 5), 7.0)]
    assert perplexity(logits, ids) == pytest.approx(5.0)
    assert np.allclose(next_token_nll(logits[0], ids[0]), math.log(5))


def test_perplexity_of_a_known_distribution() -> None:
    """p(next) = 1/2 at every position: perplexity 2, whatever the other logits."""
    ids = [0, 1, 0, 1]
    logits = np.full((4, 3), -1e9)
    logits[:, 0] = logits[:, 1] = 0.0
    assert perplexity([logits], [ids]) == pytest.approx(2.0)
    assert np.exp(log_softmax(logits)).sum(axis=1) == pytest.approx(np.ones(4))
    assert perplexity_ratio(2.02, 2.0) == pytest.approx(1.01)


def test_top1_agreement_counts_every_position() -> None:
    ref = [np.eye(4), np.eye(4)[::-1]]
    other = [np.eye(4), np.eye(4)]  # the second window agrees at no position
    assert top1_matches(other, ref) == (4, 8)
    assert top1_agreement(other, ref) == 0.5
    assert top1_agreement(ref, ref) == 1.0
    assert max_abs_diff(other, ref) == 1.0
    with pytest.raises(InputError):
        top1_matches([np.eye(3)], ref[:1])
    with pytest.raises(InputError):
        perplexity([np.eye(4)], [])


def test_kl_divergence_against_a_hand_computation() -> None:
    # Position 0: p = (1/2, 1/4, 1/4), q = (1/4, 1/2, 1/4):
    #   KL = 1/2 ln 2 + 1/4 ln(1/2) + 0 = 1/4 ln 2. Position 1: the same distribution, 0.
    # Window 2, one position: p = (1, 0, 0) up to exp(-40), q uniform: KL = ln 3 (to ~1e-16).
    p0 = np.log([0.5, 0.25, 0.25])
    q0 = np.log([0.25, 0.5, 0.25]) + 7.0  # a shift of every logit changes nothing
    ref = [np.stack([p0, p0]), np.array([[40.0, 0.0, 0.0]])]
    got = [np.stack([q0, p0 - 3.0]), np.zeros((1, 3), np.float32)]
    want = (0.25 * math.log(2) + 0.0 + math.log(3)) / 3
    assert kl_divergence(got, ref) == pytest.approx(want, rel=1e-12, abs=1e-12)
    assert kl_divergence(ref, ref) == 0.0
    with pytest.raises(InputError):
        kl_divergence(got[:1], ref)
    with pytest.raises(InputError):
        kl_divergence([np.zeros((3, 3))], ref[:1])
