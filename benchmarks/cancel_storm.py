"""Cancel-to-engine-abort time under a storm of cancelled Generate streams.

    python -m benchmarks.cancel_storm                       # 3 rounds of 300, a fresh tiny stack
    python -m benchmarks.cancel_storm --rounds 1 --streams 300 --output-json storm.json

Each round opens --streams Generate calls at once (long generations) and cancels each 0-60 ms
in. Meanwhile one Session on the engine stage asks it, every --poll-ms, which of the cancelled
requests it still holds. A request's abort time is the first poll after the last one that found
it held; its lag is that minus its cancel (0 when the engine never held it after the cancel).
Polls are answered between steps, so the figures resolve to one step. After the rounds the tool
waits for the gateway's and the engine's counts to reach 0 (the drain time) and tries
ResetPrefixCache(reset_running_requests=False) at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from benchmarks.common import add_model_args, format_table, log, percentiles, resolve_model
from benchmarks.common import write_json as write_json_file
from strand.engine_core.sampling_params import SamplingParams
from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services._proto.strand.v1 import engine_pb2_grpc, gateway_pb2_grpc, inference_pb2_grpc
from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services.common.convert import params_to_pb, prompt_to_pb
from strand.services.gateway.clients import CLIENT_METADATA, client_identity, internal_id

CLIENT_LABEL = "strand-cancel-storm"
SETTLE_S = 30.0  # after the last round: how long the counts may take to reach 0


class EnginePoller:
    """Which of the watched requests the engine still holds, asked on one Session."""

    def __init__(self, address: str, token: str, poll_s: float) -> None:
        self.address = address
        self.token = token
        self.poll_s = poll_s
        self.last_held: dict[str, float] = {}  # request id -> last poll that found it held
        self.first_held: dict[str, float] = {}  # request id -> first poll that found it held
        self.first_missing_after: dict[str, float] = {}  # request id -> first poll after that
        self.watched: set[str] = set()
        self.num_unfinished = -1
        self._stop = asyncio.Event()

    async def run(self) -> None:
        queue: asyncio.Queue[epb.EngineRequest] = asyncio.Queue()

        async def requests() -> AsyncIterator[epb.EngineRequest]:
            while True:
                yield await queue.get()

        async with grpc.aio.insecure_channel(self.address) as channel:
            call = engine_pb2_grpc.EngineStub(channel).Session(
                requests(), metadata=(("authorization", f"Bearer {self.token}"),))
            seq = 0
            while not self._stop.is_set():
                seq += 1
                ids = sorted(self.watched)
                await queue.put(epb.EngineRequest(seq=seq, query=epb.EngineQuery(
                    request_ids=ids)))
                resp = await call.read()
                now = time.time()
                self.num_unfinished = int(resp.state.num_unfinished_requests)
                missing = set(resp.state.missing_request_ids)
                for rid in ids:
                    if rid not in missing:
                        self.last_held[rid] = now
                        self.first_held.setdefault(rid, now)
                        self.first_missing_after.pop(rid, None)
                    elif rid not in self.first_missing_after:
                        self.first_missing_after[rid] = now
                await asyncio.sleep(self.poll_s)
            call.cancel()

    def stop(self) -> None:
        self._stop.set()

    def abort_time(self, rid: str, cancelled_at: float) -> float | None:
        """When the engine last dropped it (None: it still holds it)."""
        if rid not in self.first_missing_after:
            return None
        if self.last_held.get(rid, 0.0) < cancelled_at:
            return cancelled_at  # not held after the cancel
        return self.first_missing_after[rid]


async def _storm_round(stub: inference_pb2_grpc.InferenceStub, round_no: int, streams: int,
                       max_tokens: int, metadata: tuple[tuple[str, str], ...],
                       rng: random.Random, poller: EnginePoller, tag: str
                       ) -> dict[str, float]:
    """The round's cancel times (wall clock), by internal id."""
    cancelled_at: dict[str, float] = {}
    params = params_to_pb(SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                         ignore_eos=True))

    async def one(i: int) -> None:
        public = f"storm-{round_no}-{i}"
        rid = internal_id(tag, public)
        poller.watched.add(rid)
        call = stub.Generate(gpb.GenerateRequest(
            request_id=public, prompt=prompt_to_pb(f"words of stream {i} in round {round_no}"),
            params=params), metadata=metadata, timeout=120)
        await asyncio.sleep(rng.uniform(0.0, 0.06))
        call.cancel()
        cancelled_at[rid] = time.time()

    await asyncio.gather(*(one(i) for i in range(streams)))
    return cancelled_at


async def storm(gateway: str, engine: tuple[str, str], args: argparse.Namespace
                ) -> dict[str, Any]:
    rng = random.Random(args.seed)
    metadata = ((CLIENT_METADATA, CLIENT_LABEL),)
    tag = client_identity(metadata, "", False)
    poller = EnginePoller(*engine, args.poll_ms / 1000)
    polling = asyncio.ensure_future(poller.run())
    cancelled_at: dict[str, float] = {}
    async with grpc.aio.insecure_channel(gateway) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        control = gateway_pb2_grpc.GatewayStub(channel)
        start = time.monotonic()
        for r in range(args.rounds):
            cancelled_at.update(await _storm_round(stub, r, args.streams, args.max_tokens,
                                                   metadata, rng, poller, tag))
        storm_end = time.monotonic()
        while True:
            gw = (await stub.GetNumUnfinishedRequests(gpb.GetNumUnfinishedRequestsRequest(),
                                                      metadata=metadata, timeout=30)).value
            if gw == 0:
                break
            await asyncio.sleep(0.005)
        gateway_zero = time.monotonic()
        reset = await control.ResetPrefixCache(gpb.ResetPrefixCacheRequest(
            reset_running_requests=False), metadata=metadata, timeout=30)
        while poller.num_unfinished != 0 and time.monotonic() - storm_end < SETTLE_S:
            await asyncio.sleep(0.005)
        engine_zero = time.monotonic()
        # One more poll round, so every watched id's last state is known.
        await asyncio.sleep(4 * args.poll_ms / 1000 + 0.05)
    poller.stop()
    await polling
    lags = []
    late_lags = []  # of requests that reached the engine after their cancel
    still_held = 0
    for rid, at in cancelled_at.items():
        aborted = poller.abort_time(rid, at)
        if aborted is None:
            still_held += 1
            continue
        lags.append(max(0.0, aborted - at) * 1000)
        if poller.first_held.get(rid, 0.0) > at:
            late_lags.append(lags[-1])
    lat = percentiles(lags, (50, 99))
    return {"rounds": args.rounds, "streams_per_round": args.streams,
            "cancelled": len(cancelled_at), "still_held": still_held,
            "lag_ms_p50": round(lat.get("p50", 0.0), 1), "lag_ms_p99": round(lat.get("p99", 0.0), 1),
            "lag_ms_max": round(max(lags, default=0.0), 1),
            "reached_engine_after_cancel": len(late_lags),
            "their_lag_ms_p50": round(percentiles(late_lags, (50,)).get("p50", 0.0), 1),
            "gateway_zero_after_s": round(gateway_zero - storm_end, 3),
            "engine_zero_after_s": round(engine_zero - storm_end, 3),
            "engine_unfinished_end": poller.num_unfinished,
            "reset_prefix_cache_ok": bool(reset.success),
            "wall_s": round(engine_zero - start, 2)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cancel_storm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=300, help="cancelled streams per round")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--poll-ms", type=float, default=2.0,
                        help="the engine is asked this often (after each answer)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--engine-args", default="--max-num-seqs 256 --kv-cache-memory 67108864",
                        help="EngineArgs flags for the started stack (default: %(default)s)")
    parser.add_argument("--output-json", default=None)
    add_model_args(parser)
    parser.set_defaults(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2,
                        vocab_size=512)
    args = parser.parse_args(argv)
    from strand.services.launch import StackConfig, launch_stack

    model = resolve_model(args)
    config = StackConfig(model=str(model), engine_args=shlex.split(args.engine_args),
                         gateway_args=["--auto-step"])
    log(f"starting a stack on {model}")
    with launch_stack(config) as stack:
        summary = asyncio.run(storm(stack.gateway_address,
                                    (stack.address("engine"), stack.stage_token), args))
    from pathlib import Path

    write_json_file(Path(args.output_json) if args.output_json else None, summary)
    log(json.dumps(summary))
    print(format_table(
        ["cancelled", "lag p50 ms", "lag p99 ms", "lag max ms", "gateway 0 after s",
         "engine 0 after s", "reset ok"],
        [[str(summary["cancelled"]), str(summary["lag_ms_p50"]), str(summary["lag_ms_p99"]),
          str(summary["lag_ms_max"]), str(summary["gateway_zero_after_s"]),
          str(summary["engine_zero_after_s"]), str(summary["reset_prefix_cache_ok"])]]))


if __name__ == "__main__":
    main()
