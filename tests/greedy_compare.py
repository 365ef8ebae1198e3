"""Comparing greedy runs of packed GGUF weights with the same file dequantized to float.

The packed kernel of a decode step rounds each linear layer's input to int8 blocks of 32
(kernels/csrc/gguf_linear.cpp), as llama.cpp does, so logprobs move by a little and where the
dequantized model's top two tokens are within that little of each other the packed model may pick
the other one; from there the two sequences are different texts and are not compared further.
"""

from __future__ import annotations

from collections.abc import Sequence

# Logprobs (nats) of the same token at the same step may differ by this much, and a different
# greedy token is accepted only where the dequantized model had it within this much of its top.
# Measured: the tied tiny test model (logits up to ~18) moves logits by up to 0.09 (a third of
# the bound kernels.gguf_linear_ref.int8_rounding_bound gives) and logprobs by up to ~0.2; the
# untied ones by up to ~0.05.
INT8_TOL = 0.25

Step = dict[int, float]  # token id -> logprob: the step's top-k (the chosen token included)


def assert_greedy_within_int8_rounding(got: Sequence[tuple[list[int], list[Step]]],
                                       want: Sequence[tuple[list[int], list[Step]]],
                                       tol: float = INT8_TOL) -> int:
    """Each packed sequence equals the dequantized one up to its first near-tie; returns how many
    sequences diverged (at a near-tie)."""
    diverged = 0
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(got, want, strict=True):
        assert len(tokens) == len(want_tokens)
        for i, (token, want_token) in enumerate(zip(tokens, want_tokens, strict=True)):
            step, want_step = logprobs[i], want_logprobs[i]
            for t, lp in step.items():
                if t in want_step:
                    assert abs(lp - want_step[t]) <= tol, (i, t, lp, want_step[t])
            if token != want_token:
                # The dequantized model's own logprob for the packed model's pick: near its top.
                assert token in want_step, (i, token, "not in the dequantized top-k", want_step)
                assert want_step[want_token] - want_step[token] <= tol, (i, token, want_step)
                diverged += 1
                break
    return diverged
