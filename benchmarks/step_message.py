"""The engine's per-step message to the detokenizer: microseconds to build and serialise it (on
the engine's core thread, between two steps, so it adds to every step) and to parse and convert it
back (in the detokenizer), and its size, for N decoding requests.

A decode step's outputs are N (request id, one token) pairs; the rare fields (logprobs, a finish,
a first scheduled time, preemptions) ride on a few of them. The figure is that common step.

    python -m benchmarks.step_message [--batch-sizes 64,256,1024] [--steps 300]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from strand.engine_core.core.engine_io import EngineCoreOutput, EngineCoreOutputs
from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services.common.convert import core_outputs_from_pb, core_outputs_to_pb


def decode_step(batch: int, step: int) -> EngineCoreOutputs:
    """One decode step of `batch` requests; one request in 16 finishes with it (its slot is
    taken by a new one, whose first output carries its first scheduled time)."""
    outputs = []
    for i in range(batch):
        out = EngineCoreOutput(f"cmpl-{i:08x}-0", [(step * 7919 + i) % 49152],
                               num_cached_tokens=16 * (i % 4))
        if (i + step) % 16 == 0:
            out.finish_reason = "length"
        elif (i + step) % 16 == 1:
            out.first_scheduled_time = 1.7e9 + step
        outputs.append(out)
    return EngineCoreOutputs(outputs, finished_requests=set(), timestamp=1.7e9 + step)


def measure(batch: int, steps: int) -> dict[str, float]:
    """Median microseconds per step of each side, and the message's bytes."""
    encode_us, decode_us, sizes = [], [], []
    for step in range(steps):
        outs = decode_step(batch, step)
        start = time.perf_counter()
        data = epb.EngineStepOutputs(outputs=core_outputs_to_pb(outs)).SerializeToString()
        middle = time.perf_counter()
        back = core_outputs_from_pb(epb.EngineStepOutputs.FromString(data).outputs)
        end = time.perf_counter()
        if back.outputs != outs.outputs:
            raise RuntimeError(f"batch {batch}: the message did not convert back to its outputs")
        encode_us.append(1e6 * (middle - start))
        decode_us.append(1e6 * (end - middle))
        sizes.append(len(data))
    return {"batch": batch, "encode_us": statistics.median(encode_us),
            "decode_us": statistics.median(decode_us), "bytes": statistics.median(sizes)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="64,256,1024",
                        help="comma-separated numbers of decoding requests")
    parser.add_argument("--steps", type=int, default=300, help="steps timed per batch size")
    parser.add_argument("--output-json", default=None)
    args = parser.parse_args(argv)
    try:
        sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        parser.error(f"--batch-sizes must be comma-separated integers, got {args.batch_sizes!r}")
    if min(sizes) < 1 or args.steps < 1:
        parser.error("--batch-sizes must be positive integers and --steps >= 1")
    rows = [measure(b, args.steps) for b in sizes]
    print(f"{'requests':>8} {'encode us':>10} {'decode us':>10} {'us/request':>11} {'bytes':>8}")
    for r in rows:
        per = (r["encode_us"] + r["decode_us"]) / r["batch"]
        print(f"{r['batch']:>8} {r['encode_us']:>10.1f} {r['decode_us']:>10.1f} {per:>11.2f} "
              f"{r['bytes']:>8.0f}")
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
