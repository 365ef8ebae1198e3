"""Comparing greedy runs that differ by a rounding with the exact run.

Packed GGUF weights against the same file dequantized to float: the packed kernel of a decode
step rounds each linear layer's input to int8 blocks of 32 (strand/kernels/csrc/gguf_linear.cpp), as
llama.cpp does. A bfloat16 KV cache under float32 weights against a float32 one: K and V are
rounded to bfloat16 as they are written. Either way logprobs move by a little, and where the
exact run's top two tokens are within that little of each other the rounded run may pick the other
one; from there the two sequences are different texts and are not compared further (vLLM compares
its fp8 KV cache runs the same way, check_logprobs_close).
"""

from __future__ import annotations

from collections.abc import Sequence

# Logprobs (nats) of the same token at the same step may differ by this much, and a different
# greedy token is accepted only where the dequantized model had it within this much of its top.
# Measured: the tied tiny test model (logits up to ~18) moves logits by up to 0.09 (a third of
# the bound strand.kernels.gguf_linear_ref.int8_rounding_bound gives) and logprobs by up to ~0.2; the
# untied ones by up to ~0.05.
INT8_TOL = 0.25

Step = dict[int, float]  # token id -> logprob: the step's top-k (the chosen token included)


def assert_greedy_within_rounding(got: Sequence[tuple[list[int], list[Step]]],
                                       want: Sequence[tuple[list[int], list[Step]]],
                                       tol: float = INT8_TOL) -> int:
    """Each rounded sequence (`got`) equals the exact one up to its first near-tie; returns how
    many sequences diverged (at a near-tie)."""
    diverged = 0
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(got, want, strict=True):
        assert len(tokens) == len(want_tokens)
        for i, (token, want_token) in enumerate(zip(tokens, want_tokens, strict=True)):
            step, want_step = logprobs[i], want_logprobs[i]
            for t, lp in step.items():
                if t in want_step:
                    assert abs(lp - want_step[t]) <= tol, (i, t, lp, want_step[t])
            if token != want_token:
                # The exact run's own logprob for the rounded run's pick: near its top.
                assert token in want_step, (i, token, "not in the exact run's top-k", want_step)
                assert want_step[want_token] - want_step[token] <= tol, (i, token, want_step)
                diverged += 1
                break
    return diverged
