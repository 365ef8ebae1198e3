"""AsyncLLM: vLLM's asyncio engine API in process, over LLMEngine.

    llm = AsyncLLM.from_engine_args(EngineArgs(model=...))
    async for output in llm.generate("Hello", SamplingParams(max_tokens=8), "req-1"): ...
    llm.shutdown()

The engine steps on a thread of its own, back to back while requests are unfinished; it releases
the GIL in its kernels, so the event loop runs on between steps' Python parts. Everything that
touches the engine (adds, aborts, resets) is a command run on that thread between two steps: the
engine is never used from two threads. Each step's outputs go to the loop in one callback and
into one RequestOutputCollector per request, so a consumer that lags gets its outputs merged
(strand/engine_core/output_collector.py) and never holds the engine back.

A generate() left early (break, cancellation) aborts its request; abort() ends a stream with a
last output whose finish_reason is "abort", as vLLM's do. If a step raises, every stream gets the
error (EngineDeadError) and the engine takes no more requests.

Its OpenMP team is the only one the process should have: the constructor lets go of the
caller's thread's team (libgomp.py), which torch work done on that thread before leaves behind;
torch work on other threads while the engine runs brings a second team back, and with it slower
steps (most where CPUs are few). Run such work in another process.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterable
from concurrent.futures import Future
from typing import Any, TypeVar

from strand.engine_core.config import EngineArgs
from strand.engine_core.errors import DuplicateRequestError
from strand.engine_core.llm_engine import LLMEngine, PromptType
from strand.engine_core.lora.request import LoRARequest
from strand.engine_core.output_collector import RequestOutputCollector
from strand.engine_core.outputs import CompletionOutput, RequestOutput
from strand.engine_core.sampling_params import SamplingParams
from strand.engine_core.step_driver import AddBursts
from strand.platform.cpu_binding import binding_mode
from strand.platform.libgomp import release_idle_team

T = TypeVar("T")


class EngineDeadError(RuntimeError):
    """The engine's step raised: no request can go on (vLLM's name)."""


class AsyncLLM:
    def __init__(self, make_engine: Callable[[], LLMEngine]) -> None:
        """Builds the engine on the stepping thread (on CPU, torch's OpenMP threads belong to
        the thread that loads the model: core/engine.py's warning) and returns once it is
        loaded; what loading raises is raised here."""
        self._commands: queue.SimpleQueue[_Command | None] = queue.SimpleQueue()
        self._collectors: dict[str, tuple[RequestOutputCollector, int]] = {}  # id -> (it, n)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.dead_error: EngineDeadError | None = None
        self._closed = False
        self._bursts = AddBursts()
        loaded: Future[LLMEngine] = Future()
        binding_mode()  # an unreadable STRAND_CPU_BIND is the caller's ValueError
        self._thread = threading.Thread(target=self._run, args=(make_engine, loaded),
                                        name="strand-async-llm", daemon=True)
        self._thread.start()
        self.engine = loaded.result()
        # The caller's own OpenMP team, if torch work on this thread left one, would double the
        # process's compute threads and shorten every team's spin (libgomp.py): let it go.
        release_idle_team()

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> AsyncLLM:
        return cls(lambda: LLMEngine.from_engine_args(args))

    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and not self._closed

    @property
    def errored(self) -> bool:
        return self.dead_error is not None

    async def generate(self, prompt: PromptType, sampling_params: SamplingParams | None,
                       request_id: str, *, lora_request: LoRARequest | None = None,
                       priority: int = 0) -> AsyncGenerator[RequestOutput, None]:
        """The request's RequestOutputs as its sampling_params.output_kind says, until it
        finishes. Bad input raises ValueError (naming the field) before any output."""
        params = sampling_params or SamplingParams()
        self._bind_loop()
        if not isinstance(request_id, str):
            raise ValueError(f"request_id must be a str, got {type(request_id).__name__}")
        if request_id in self._collectors:
            raise DuplicateRequestError(f"request_id {request_id!r} is already in use")
        collector = RequestOutputCollector(params.output_kind, request_id)
        # Registered before the add: the first step after it may already answer.
        self._collectors[request_id] = (collector, params.n)
        try:
            await self._call(lambda: self.engine.add_request(
                request_id, prompt, params, lora_request=lora_request, priority=priority),
                is_add=True)
        except BaseException:
            self._collectors.pop(request_id, None)
            raise
        finished = False
        try:
            while not finished:
                output = await collector.get()
                finished = output.finished
                yield output
        finally:
            if not finished:  # left early: the request must not run on unread
                self._collectors.pop(request_id, None)
                self._submit(lambda: self.engine.abort_request(request_id))

    async def abort(self, request_id: str | Iterable[str]) -> None:
        """End the requests; each one's stream gets a last output with finish_reason "abort".
        Ids that are not live are ignored, as LLMEngine.abort_request ignores them."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)

        def abort_live() -> list[str]:
            live = [i for i in ids if self.engine.output_processor.has_request(i)]
            self.engine.abort_request(live)
            return live

        for rid in await self._call(abort_live):
            entry = self._collectors.pop(rid, None)
            if entry is not None:
                entry[0].put(_abort_output(rid, entry[1]))

    async def reset_prefix_cache(self, reset_running_requests: bool = False,
                                 reset_connector: bool = False) -> bool:
        return await self._call(lambda: self.engine.reset_prefix_cache(
            reset_running_requests, reset_connector))

    async def get_num_unfinished_requests(self) -> int:
        return await self._call(self.engine.get_num_unfinished_requests)

    def shutdown(self) -> None:
        """Stop the stepping thread (requests still running end with the engine) and the
        engine's workers."""
        if self._closed:
            return
        self._closed = True
        self._commands.put(None)
        self._thread.join()
        self.engine.shutdown()
        if self._collectors:  # no stream is left waiting for an output that cannot come
            error = EngineDeadError("AsyncLLM was shut down before the request finished")
            loop = self._loop
            if loop is not None and loop.is_running() and not _in_loop(loop):
                loop.call_soon_threadsafe(self._end_streams, error)
            else:
                self._end_streams(error)

    # The loop's side.

    def _bind_loop(self) -> None:
        if self.dead_error is not None:
            raise self.dead_error
        if self._closed:
            raise RuntimeError("AsyncLLM is shut down")
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._collectors:
                raise RuntimeError("AsyncLLM serves one event loop at a time: streams of "
                                   "another loop are still open")
            self._loop = loop  # nothing in flight on the old one (a later asyncio.run, say)

    async def _call(self, fn: Callable[[], T], is_add: bool = False) -> T:
        self._bind_loop()
        return await asyncio.wrap_future(self._submit(fn, is_add))

    def _submit(self, fn: Callable[[], T], is_add: bool = False) -> Future[T]:
        done: Future[T] = Future()
        self._commands.put((fn, done, is_add))
        return done

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            entry = self._collectors.get(output.request_id)
            if entry is None:
                continue  # its stream was left or aborted: nothing more for it
            entry[0].put(output)
            if output.finished:
                del self._collectors[output.request_id]

    def _fail_all(self, error: EngineDeadError) -> None:
        self.dead_error = error
        self._end_streams(error)

    def _end_streams(self, error: EngineDeadError) -> None:
        for collector, _ in self._collectors.values():
            collector.put(error)
        self._collectors.clear()

    # The engine's thread.

    def _run(self, make_engine: Callable[[], LLMEngine], loaded: Future[LLMEngine]) -> None:
        _execute(make_engine, loaded)
        if loaded.exception() is not None:
            return
        self.engine = loaded.result()
        self.engine.engine_core.spread_team_after_idle()  # this thread is the engine's own
        while True:
            # Wait for a command only while there is nothing to step.
            if self._run_commands(not self.engine.has_unfinished_requests()):
                return
            # A burst of adds (many generate() calls at once) joins one step, as a loop that
            # adds them all and then steps would (step_driver.py, BURST_HOLD).
            held_since = time.monotonic()
            while self._bursts.hold(time.monotonic(), held_since):
                if self._run_commands(True, timeout=self._bursts.quiet_s):
                    return
            if not self.engine.has_unfinished_requests():
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # noqa: BLE001 - every stream must hear of it
                self._die(EngineDeadError(f"the engine's step failed: {exc!r}"))
                return
            if outputs:
                self._post(self._dispatch, outputs)

    def _run_commands(self, wait: bool, timeout: float | None = None) -> bool:
        """Run the commands that came (waiting for one first); True once told to stop."""
        commands: list[_Command | None] = []
        try:
            if wait:
                commands.append(self._commands.get(timeout=timeout))
            while True:
                commands.append(self._commands.get_nowait())
        except queue.Empty:
            pass
        for command in commands:
            if command is None:
                return True
            fn, done, is_add = command
            if is_add:
                self._bursts.note_add(time.monotonic(),
                                      engine_was_idle=not self.engine.has_unfinished_requests())
            _execute(fn, done)
        return False

    def _die(self, error: EngineDeadError) -> None:
        """Every stream gets the error; every later command fails with it until shut down."""
        self._post(self._fail_all, error)
        while (command := self._commands.get()) is not None:
            if command[1].set_running_or_notify_cancel():
                command[1].set_exception(error)

    def _post(self, fn: Callable[[Any], None], arg: Any) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(fn, arg)


_Command = tuple[Callable[[], Any], "Future[Any]", bool]  # (what, its result, is it an add)


def _execute(fn: Callable[[], Any], done: Future[Any]) -> None:
    if done.set_running_or_notify_cancel():
        try:
            done.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            done.set_exception(exc)


def _in_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _abort_output(request_id: str, n: int) -> RequestOutput:
    return RequestOutput(request_id=request_id, prompt=None, prompt_token_ids=[],
                         outputs=[CompletionOutput(index=i, text="", token_ids=[],
                                                   finish_reason="abort") for i in range(n)],
                         finished=True)
