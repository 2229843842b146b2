"""The batch runner: programs x examples in, exactly one `ExecutionResult` per submission out.

The trainer's side of execution. It owns the tool host (and so the labels and models) and talks
to the lean sandbox supervisor, which it starts first. For each submission it registers the
example's image by content hash and sends the sandbox only `{"image": SourceImage(ref, w, h)}`:
never the query's answers. Identical programs (same `program_key`) on the same example run once
and the result is shared. It serves the sandboxes' tool calls, keeps a trace per program, and
enforces the per-program tool-call cap.

Two clocks bound a program (docs/design-notes.md, "Program timeouts"): `timeout_s` of its own
time, tool waits excluded (the supervisor's), and `wall_timeout_s` from its first tool request on,
tool waits included (the runner's: that request is how it learns the program has started).

`infra_error` is reserved for our failures: the tool host failing, the sandbox failing to set up,
the supervisor dying, or shutting down with work in flight. The trainer masks those.

`sandbox: none` (debugging only) runs programs in this process instead: see `vprl/executor/unsandboxed.py`.
Where `sandbox: auto` (the default) finds no namespaces, the restricted sandbox's one-line notice is
logged at start (docs/design-notes.md#the-sandbox-without-namespaces).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import itertools
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from tqdm.auto import tqdm

from vprl.data.records import Example
from vprl.executor.api import SourceImage, Video
from vprl.executor.host import ToolHost
from vprl.executor.limits import MAX_ERROR, MAX_MESSAGE, MAX_NAME, MAX_SNIPPET, MAX_TRACE
from vprl.executor.program import line_map, program_key, valid_line
from vprl.executor.results import ExecutionResult, ToolCallRecord, short_result
from vprl.executor.runner_config import SANDBOX_MODES, RunnerConfig
from vprl.executor.sandbox.channel import encode_inputs
from vprl.executor.sandbox.connection import SandboxUnavailable, SupervisorConnection
from vprl.executor.tools.calls import ToolCall
from vprl.executor.tools.errors import ToolError, ToolUnavailable
from vprl.executor.tools.images import ImageInfo
from vprl.executor.unsandboxed import run_unsandboxed, warn_unsandboxed

log = logging.getLogger(__name__)


@dataclass
class _TaskState:
    example_id: str
    key: str
    future: asyncio.Future
    trace: list[ToolCallRecord] = field(default_factory=list)
    rpcs: int = 0
    rpc_limit: bool = False
    infra: str | None = None
    owner: object = field(default_factory=object)  # holds the images this program registers
    overrun: asyncio.TimerHandle | None = None  # stops it `wall_timeout_s` after its first request


class BatchRunner:
    """Async runner: `async with BatchRunner(host, config) as r: results = await r.run(pairs)`."""

    def __init__(self, host: ToolHost, config: RunnerConfig | None = None) -> None:
        self.host = host
        self.config = config or RunnerConfig()
        self.supervisor: SupervisorConnection | None = None
        self._tasks: dict[int, _TaskState] = {}
        self._ids = itertools.count(1)
        self._inflight: dict[tuple[str, str, str], asyncio.Future] = {}
        self._memo: OrderedDict[tuple[str, str, str], ExecutionResult] = OrderedDict()
        # The source text each in-flight or remembered result ran: a program with the same key but
        # other comments or layout shares the result, with its trace's lines moved to its own text.
        self._ran: dict[tuple[str, str, str], str] = {}
        self._images: dict[tuple[str, str | None], ImageInfo] = {}
        self._reader: asyncio.Task | None = None
        self._local_lock: asyncio.Lock | None = None
        self._rpcs: set[asyncio.Task] = set()  # tool requests being answered
        self._closed = False

    # -- life cycle ------------------------------------------------------------------------------
    async def start(self) -> BatchRunner:
        if self.config.sandbox == "none":
            warn_unsandboxed()
            self._local_lock = asyncio.Lock()
        else:
            cfg = self.config
            self.supervisor = await SupervisorConnection.start(
                cfg.slots, cfg.limits, cfg.require_layers, spawn=cfg.spawn, sandbox=cfg.sandbox
            )
            if self.supervisor.notice:
                log.warning(self.supervisor.notice)
            self._reader = asyncio.get_running_loop().create_task(self._read_loop())
        return self

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._fail_all("the executor shut down with this program in flight")
        for rpc in list(self._rpcs):  # a stopped program's last call may still be waiting on the tools
            rpc.cancel()
        await asyncio.gather(*self._rpcs, return_exceptions=True)
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self.supervisor is not None:
            await self.supervisor.close()

    async def __aenter__(self) -> BatchRunner:
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    @property
    def layers(self) -> dict[str, str]:
        return self.supervisor.layers if self.supervisor else {}

    @property
    def alive(self) -> bool:
        """Whether programs can run: the supervisor is up and its messages are being read (always,
        without a sandbox)."""
        if self.config.sandbox == "none":
            return not self._closed
        running = self._reader is not None and not self._reader.done()
        return not self._closed and running and self.supervisor is not None and self.supervisor.alive()

    @property
    def isolation(self) -> str:
        """How programs are isolated: "full", "restricted" or "none"."""
        return self.supervisor.isolation if self.supervisor else "none"

    # -- submitting ------------------------------------------------------------------------------
    async def run(
        self, pairs: Iterable[tuple[Example, str]], progress: bool = False, desc: str = "programs"
    ) -> list[ExecutionResult]:
        """Run every (example, program source) pair; results come back in submission order."""
        futures = [self.submit(example, source) for example, source in pairs]
        if progress:
            bar = tqdm(total=len(futures), desc=desc, unit="prog")
            for fut in futures:
                fut.add_done_callback(lambda _: bar.update())
            try:
                return list(await asyncio.gather(*futures))
            finally:
                bar.close()
        return list(await asyncio.gather(*futures))

    def submit(self, example: Example, source: str) -> asyncio.Future:
        """Schedule one program on one example; the future always resolves to an ExecutionResult."""
        loop = asyncio.get_running_loop()
        pkey = program_key(source)
        try:
            visual_ref, inputs = self._inputs(example)
        except (OSError, ValueError) as exc:
            # The dataset's fault, not the program's: masked, named so the example can be fixed or dropped.
            what = "video" if example.task == "video_qa" else "image"
            error = f"{what}: example {example.id}: {exc}"
            return _resolved(loop, ExecutionResult(example.id, pkey, "infra_error", error=error[:MAX_ERROR]))
        key = (example.id, visual_ref, pkey)
        if key in self._memo:
            self._memo.move_to_end(key)
            return _resolved(loop, _as_written(self._memo[key], self._ran[key], source))
        if key in self._inflight:
            shared = self._inflight[key]
            if self._ran[key] == source:
                return shared
            mine = loop.create_future()
            ran = self._ran[key]
            shared.add_done_callback(lambda f: mine.set_result(_as_written(f.result(), ran, source)))
            return mine
        future = loop.create_future()
        if self._closed:
            future.set_result(ExecutionResult(example.id, pkey, "infra_error", error="the executor is closed"))
            return future
        self._inflight[key] = future
        self._ran[key] = source
        future.add_done_callback(lambda f, key=key: self._remember(key, f))
        state = _TaskState(example.id, pkey, future)
        loop.create_task(self._execute(state, source, inputs))
        return future

    def _inputs(self, example: Example) -> tuple[str, dict[str, Any]]:
        """`(content key of the visual input, the program's inputs)`; never the answers.

        Images: `{"image": SourceImage}`. Videos (`video_qa`): `example.image` is a video file or
        a directory of frames, `meta["num_frames"]` optionally sets how many evenly spaced frames
        the program gets, `meta["possible_answers"]` (or `"options"`) the choices; the inputs are
        `{"video": Video, "question": query, "possible_answers": [...]}` (the NExT-QA signature).
        """
        if example.task != "video_qa":
            image = self._image(example)
            return image.ref, {"image": SourceImage(image.ref, image.width, image.height)}
        meta = example.meta if isinstance(example.meta, dict) else {}
        frames = self.host.add_video(example.image, meta.get("num_frames"), meta.get("videoId"))
        options = meta.get("possible_answers", meta.get("options", []))
        if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
            raise ValueError(f"example {example.id}: meta possible_answers must be a list of strings")
        video = Video([SourceImage(f.ref, f.width, f.height) for f in frames])
        key = "video:" + hashlib.sha1(" ".join(f.ref for f in frames).encode()).hexdigest()[:20]
        return key, {"video": video, "question": example.query, "possible_answers": list(options)}

    def _image(self, example: Example) -> ImageInfo:
        image_id = example.meta.get("imageId") if isinstance(example.meta, dict) else None
        cache_key = (example.image, image_id)
        if cache_key not in self._images:
            self._images[cache_key] = self.host.images.add_file(example.image, image_id=image_id)
        return self._images[cache_key]

    def _remember(self, key: tuple[str, str, str], future: asyncio.Future) -> None:
        self._inflight.pop(key, None)
        result = future.result()
        if result.status != "infra_error":  # our failures are retried, not remembered
            self._memo[key] = result
            while len(self._memo) > self.config.memo_size:
                self._ran.pop(self._memo.popitem(last=False)[0], None)
        else:
            self._ran.pop(key, None)

    async def _execute(self, state: _TaskState, source: str, inputs: dict[str, Any]) -> None:
        try:
            if self.config.sandbox == "none":
                answer = functools.partial(self._answer, state)
                frame = await run_unsandboxed(self.host, state.owner, answer, self._local_lock, source, inputs)
                self._resolve(state, frame)
                return
            if self.supervisor is None or self._reader is None or self._reader.done():
                raise ToolUnavailable("the sandbox supervisor is not running")
            task_id = next(self._ids)
            self._tasks[task_id] = state
            await self.supervisor.send(
                {
                    "op": "run",
                    "task": task_id,
                    "source": source,
                    "inputs": encode_inputs(inputs),
                    "timeout": self.config.timeout_s,
                    "rpc_timeout": self.config.rpc_timeout_s + 5.0,  # backstop behind the host's own timeout
                }
            )
        except Exception as exc:  # noqa: BLE001 — whatever broke here is ours; the future must still resolve
            self._resolve(
                state, {"status": "infra_error", "error": f"could not start the program: {exc!r}"[:MAX_ERROR]}
            )

    # -- supervisor messages ---------------------------------------------------------------------
    async def _read_loop(self) -> None:
        try:
            while True:
                frame = await self.supervisor.recv()
                op = frame.get("op")
                if op == "rpc":
                    state = self._tasks.get(frame["task"])
                    if state is not None:
                        rpc = asyncio.get_running_loop().create_task(
                            self._serve_rpc(frame["task"], state, frame["request"])
                        )
                        self._rpcs.add(rpc)
                        rpc.add_done_callback(self._rpcs.discard)
                elif op == "done":
                    state = self._tasks.pop(frame["task"], None)
                    if state is not None:
                        self._resolve(state, frame)
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            self._fail_all(f"the sandbox supervisor died: {exc!r}"[:MAX_MESSAGE])
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 — a broken supervisor stream: fail what is in flight, loudly
            self._fail_all(f"bad message from the sandbox supervisor: {exc!r}"[:MAX_MESSAGE])

    async def _serve_rpc(self, task_id: int, state: _TaskState, request: dict[str, Any]) -> None:
        if state.overrun is None:
            loop = asyncio.get_running_loop()
            state.overrun = loop.call_later(self.config.wall_timeout_s, self._stop_overrun, task_id)
        reply = await self._answer(state, request)
        if task_id in self._tasks:
            try:
                if state.rpc_limit:  # no need to let it spin on: the status is settled
                    await self.supervisor.send({"op": "kill", "task": task_id, "status": "rpc_limit"})
                    return
                await self.supervisor.send({"op": "reply", "task": task_id, "reply": reply})
            except (ConnectionError, RuntimeError) as exc:
                self._fail_all(f"lost the sandbox supervisor: {exc!r}")

    def _stop_overrun(self, task_id: int) -> None:
        if task_id not in self._tasks or self.supervisor is None:
            return
        error = (
            f"the program ran longer than {self.config.wall_timeout_s:g} s after its first tool call, "
            "counting the time it waited on the tools"
        )
        frame = {"op": "kill", "task": task_id, "status": "timeout", "error": error}
        task = asyncio.get_running_loop().create_task(self.supervisor.send(frame))
        task.add_done_callback(self._kill_sent)

    def _kill_sent(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._fail_all(f"lost the sandbox supervisor: {task.exception()!r}"[:MAX_MESSAGE])

    async def _answer(self, state: _TaskState, request: dict[str, Any]) -> dict[str, Any]:
        """One request from a program -> a reply frame. Never raises."""
        state.rpcs += 1
        if state.rpcs > self.config.max_rpcs:
            # Remembered even if the program swallows the exception: the status is rpc_limit.
            state.rpc_limit = True
            return {"error": "ToolError", "message": f"the program made more than {self.config.max_rpcs} tool calls"}
        method = request.get("method")
        try:
            if method == "call":
                call = _parse_call(request)
                line = valid_line(request.get("line"))
                try:
                    result, cached, seconds = await self.host.call(call)
                except ToolError as exc:
                    error = f"ToolError: {exc}"[:MAX_TRACE]
                    state.trace.append(ToolCallRecord(call.tool, call.args, _box(call), error, line=line))
                    raise
                state.trace.append(
                    ToolCallRecord(
                        call.tool, call.args, _box(call), short_result(result), cached, round(seconds, 6), line
                    )
                )
                return {"ok": result}
            if method == "pixels":
                return {"ok": await self.host.pixels(str(request.get("image")))}
            if method == "register":
                if state.future.done():  # its images were already released; do not leak a new one
                    return {"error": "ToolError", "message": "the program has finished"}
                return {"ok": self.host.register(request.get("shape"), request.get("data"), owner=state.owner)}
            return {"error": "ToolError", "message": f"unknown request {str(method)[:MAX_NAME]!r}"}
        except ToolError as exc:
            return {"error": "ToolError", "message": str(exc)[:MAX_ERROR]}
        except ToolUnavailable as exc:
            state.infra = state.infra or str(exc)[:MAX_ERROR]
            return {"error": "ToolUnavailable", "message": str(exc)[:MAX_ERROR]}
        except Exception as exc:  # noqa: BLE001 — the tool host itself broke: our failure
            state.infra = state.infra or f"tool host failure: {type(exc).__name__}: {exc}"[:MAX_ERROR]
            return {"error": "ToolUnavailable", "message": "tool host failure"}

    # -- results ---------------------------------------------------------------------------------
    def _resolve(self, state: _TaskState, frame: dict[str, Any]) -> None:
        if state.overrun is not None:
            state.overrun.cancel()
        if state.future.done():
            return
        status, error = frame.get("status", "infra_error"), frame.get("error")
        if state.infra is not None:
            status, error = "infra_error", state.infra
        elif state.rpc_limit:
            status = "rpc_limit"
            error = f"the program made more than {self.config.max_rpcs} tool calls"
        elif status == "infra_error" and frame.get("from_program"):
            # The program claims a tool failure we never reported: it forged or provoked it itself.
            status, error = "killed", f"protocol violation: unexplained tool failure ({error})"[:MAX_ERROR]
        result = ExecutionResult(
            example_id=state.example_id,
            program_key=state.key,
            status=status,
            answer=frame.get("answer") if status == "ok" else None,
            error=error,
            duration_s=float(frame.get("duration_s", 0.0)),
            tool_calls=tuple(state.trace),
            stdout=frame.get("stdout", ""),
            rpc_wait_s=float(frame.get("rpc_wait_s", 0.0)),
        )
        state.future.set_result(result)
        self.host.release(state.owner)  # the images the program built are not needed any more

    def _fail_all(self, message: str) -> None:
        for task_id in list(self._tasks):
            self._resolve(self._tasks.pop(task_id), {"status": "infra_error", "error": message})


def _parse_call(request: dict[str, Any]) -> ToolCall:
    tool, image, box, args = request.get("tool"), request.get("image"), request.get("box"), request.get("args")
    if not isinstance(tool, str) or not (image is None or isinstance(image, str)) or not isinstance(args, dict):
        raise ToolError("malformed tool call")
    if box is not None and not (isinstance(box, list) and len(box) == 4 and all(type(v) is int for v in box)):
        raise ToolError(f"box must be four integers, got {str(box)[:MAX_SNIPPET]}")
    return ToolCall(tool, image, tuple(box) if box else None, args)


def _box(call: ToolCall) -> list[int] | None:
    return list(call.box) if call.box else None


def _as_written(result: ExecutionResult, ran: str, source: str) -> ExecutionResult:
    """`result`, which `ran` produced, for `source` (the same program_key): the trace's lines moved
    to where the same calls are in `source`."""
    if ran == source or not any(c.line is not None for c in result.tool_calls):
        return result
    lines = line_map(ran, source)
    calls = tuple(replace(c, line=lines.get(c.line)) if c.line is not None else c for c in result.tool_calls)
    return replace(result, tool_calls=calls)


def _resolved(loop: asyncio.AbstractEventLoop, result: ExecutionResult) -> asyncio.Future:
    future = loop.create_future()
    future.set_result(result)
    return future


class SyncRunner:
    """Blocking wrapper for callers without an event loop (a trl reward function, scripts).

    It runs a `BatchRunner` on its own event-loop thread: `with SyncRunner(host) as r: r.run(pairs)`.
    """

    def __init__(self, host: ToolHost, config: RunnerConfig | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="executor-loop", daemon=True)
        self._thread.start()
        self.runner = BatchRunner(host, config)
        try:
            self._wait(self.runner.start())
        except BaseException:
            self._stop_loop()
            raise

    def _wait(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def run(self, pairs: Iterable[tuple[Example, str]], progress: bool = False) -> list[ExecutionResult]:
        pairs = list(pairs)

        async def go():
            return await self.runner.run(pairs, progress=progress)

        return self._wait(go())

    def restart(self) -> None:
        """Replace the batch runner (after its supervisor died) with a fresh one on the same loop,
        host and settings; whoever holds this `SyncRunner` keeps using it. Work in flight on the
        old one has already failed as `infra_error`."""
        old = self.runner
        self._wait(old.close())
        fresh = BatchRunner(old.host, old.config)
        self._wait(fresh.start())
        self.runner = fresh

    def close(self) -> None:
        if self._thread.is_alive():
            try:
                self._wait(self.runner.close())
            finally:
                self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> SyncRunner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["BatchRunner", "RunnerConfig", "SandboxUnavailable", "SyncRunner", "SANDBOX_MODES"]
