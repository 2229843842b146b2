"""The tool host: the one place that owns a `ToolBackend` (scene graphs, models, GPU).

Sandboxes never see the backend; their tool calls arrive here as JSON. The host validates each
call, answers repeats from a content-keyed cache (tool, backend config, image hash, box,
arguments), merges identical calls that are in flight, and micro-batches concurrent calls per tool
(`max_batch_size`, `max_wait_ms`) so a GPU backend sees batches. The backend runs on one worker
thread, so a slow or hung model never blocks the event loop, and every call has a timeout.
`preload()` loads the backend's models before the first call: the timeout is for a hung model,
and a cold load (BLIP-2 XXL's can outlast it) would otherwise spend it and fail the first steps.

Failure policy: `ToolError` (bad arguments) is the program's fault and is raised back into the
program; a backend that raises `ToolUnavailable`, crashes, hangs past `rpc_timeout_s` or returns
something that is not JSON is *our* fault and becomes `ToolUnavailable` (-> `infra_error`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import statistics
import time
from collections import OrderedDict, deque
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from vprl.data.safe_files import MAX_VIDEO_BYTES, check_regular_file
from vprl.executor.limits import MAX_NAME, MAX_TRACE
from vprl.executor.tools.base import ToolBackend
from vprl.executor.tools.calls import MAX_TEXT, ToolCall, validate_call
from vprl.executor.tools.errors import ToolError, ToolUnavailable
from vprl.executor.tools.images import ImageInfo, load_rgb

# Owner of program images registered without one (callers that predate owners): they are still
# marked program-built, so a backend that cannot look at them is not counted as our failure, and
# they fall under the store's cap on program images.
_UNOWNED = "<no owner>"

MAX_REGISTERED_PIXELS = 4096 * 4096 * 3
MAX_PROGRAM_IMAGE_BYTES = 256 << 20  # pixels one program may have registered at once
MAX_VIDEO_FRAMES = 32  # frames of a video given to a program when the example does not say
FRAME_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")


class ToolHost:
    def __init__(
        self,
        backend: ToolBackend,
        max_batch_size: int = 32,
        max_wait_ms: float = 2.0,
        rpc_timeout_s: float = 30.0,
        cache_size: int = 200_000,
        max_program_image_bytes: int = MAX_PROGRAM_IMAGE_BYTES,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.backend = backend
        self.images = backend.images
        self.max_batch_size = max_batch_size
        self.max_wait_ms = max_wait_ms
        self.rpc_timeout_s = rpc_timeout_s
        self.cache_size = cache_size
        self.max_program_image_bytes = max_program_image_bytes
        self._backend_hash = backend.config_hash()
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._inflight: dict[str, asyncio.Future] = {}
        self._queues: dict[str, list[tuple[ToolCall, asyncio.Future]]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._pool = ThreadPoolExecutor(backend.max_concurrent_batches, thread_name_prefix="tool-backend")
        self._io_pool = ThreadPoolExecutor(1, thread_name_prefix="tool-host-io")  # image reads
        self._latency: deque[float] = deque(maxlen=20_000)
        self._counts = {
            "calls": 0,
            "cache_hits": 0,
            "inflight_hits": 0,
            "backend_calls": 0,
            "batches": 0,
            "tool_errors": 0,
            "unavailable": 0,
            "pixels": 0,
            "registered": 0,
            "images_evicted": 0,
        }
        self._batch_sizes: dict[int, int] = {}
        self._videos: dict[tuple[str, int | None], list[ImageInfo]] = {}

    def preload(self) -> list[str]:
        """Load every model of the backend now, on the thread its calls run on; returns what loaded.
        Call it once the sandbox supervisor is up (it must start lean) and before the first program."""
        return self._pool.submit(self.backend.preload).result()

    # -- tool calls ------------------------------------------------------------------------------
    async def call(self, call: ToolCall) -> tuple[Any, bool, float]:
        """Answer one call: `(result, cached, seconds)`. Raises ToolError or ToolUnavailable."""
        t0 = time.perf_counter()
        self._counts["calls"] += 1
        try:
            self._check_image(call.image)
            validate_call(call, self.images)
        except ToolError:
            self._counts["tool_errors"] += 1
            raise
        key = call.cache_key(self._backend_hash)
        program_image = call.image is not None and self.images.program_built(call.image)
        if key in self._cache:
            self._cache.move_to_end(key)
            self._counts["cache_hits"] += 1
            return self._cache[key], True, time.perf_counter() - t0
        shared = key in self._inflight
        if shared:
            self._counts["inflight_hits"] += 1
            future = self._inflight[key]
        else:
            future = asyncio.get_running_loop().create_future()
            self._inflight[key] = future
            self._enqueue(call, future)
        try:
            result = await asyncio.wait_for(asyncio.shield(future), self.rpc_timeout_s)
        except TimeoutError:
            self._counts["unavailable"] += 1
            raise ToolUnavailable(f"the {call.tool} tool did not answer within {self.rpc_timeout_s:g} s") from None
        except ToolUnavailable as exc:
            self._counts["unavailable"] += 1
            if program_image:
                # The program chose to ask about an image it built; a backend that cannot look at
                # such images (the oracle has no scene for it) is not our failure.
                raise ToolError(f"{exc} (the image was built by the program)") from None
            raise
        except ToolError:
            self._counts["tool_errors"] += 1
            raise
        finally:
            if not shared and self._inflight.get(key) is future:
                del self._inflight[key]
        seconds = time.perf_counter() - t0
        self._latency.append(seconds)
        return result, shared, seconds

    def _check_image(self, ref: str | None) -> None:
        # A program can only know refs it was given or registered; anything else is its invention.
        if ref is not None and ref not in self.images:
            raise ToolError(
                f"unknown image {str(ref)[:MAX_NAME]!r}: use the image you were given or ImagePatch crops of it"
            )

    def _enqueue(self, call: ToolCall, future: asyncio.Future) -> None:
        if call.image is not None:
            self.images.pin(call.image)  # a program image stays until its call is done (`_run_pinned`)
        queue = self._queues.setdefault(call.tool, [])
        queue.append((call, future))
        if len(queue) >= self.max_batch_size:
            self._flush(call.tool)
        elif len(queue) == 1:
            loop = asyncio.get_running_loop()
            self._timers[call.tool] = loop.call_later(self.max_wait_ms / 1000, self._flush, call.tool)

    def _flush(self, tool: str) -> None:
        timer = self._timers.pop(tool, None)
        if timer is not None:
            timer.cancel()
        items = self._queues.pop(tool, [])
        if items:
            asyncio.get_running_loop().create_task(self._run_pinned(tool, items))

    async def _run_pinned(self, tool: str, items: list[tuple[ToolCall, asyncio.Future]]) -> None:
        try:
            await self._run_batch(tool, items)
        finally:
            for call, _ in items:
                if call.image is not None:
                    self.images.unpin(call.image)

    async def _run_batch(self, tool: str, items: list[tuple[ToolCall, asyncio.Future]]) -> None:
        self._counts["batches"] += 1
        self._batch_sizes[len(items)] = self._batch_sizes.get(len(items), 0) + 1
        calls = [call for call, _ in items]
        try:
            results = await self._backend_run(tool, calls)
        except ToolError as exc:
            if len(items) == 1:
                _resolve(items[0][1], exc=exc)
                return
            # One bad call must not fail its batch-mates: answer them one at a time.
            for item in items:
                await self._run_batch(tool, [item])
            return
        except ToolUnavailable as exc:
            for _, future in items:
                _resolve(future, exc=exc)
            return
        for (call, future), result in zip(items, results):
            self._cache[call.cache_key(self._backend_hash)] = result
            _resolve(future, result=result)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    async def _backend_run(self, tool: str, calls: list[ToolCall]) -> list[Any]:
        loop = asyncio.get_running_loop()
        self._counts["backend_calls"] += len(calls)
        try:
            results = await loop.run_in_executor(self._pool, self.backend.run, tool, calls)
        except (ToolError, ToolUnavailable, asyncio.CancelledError, GeneratorExit):
            raise  # GeneratorExit: the event loop shut down with this batch in flight; nothing is waiting
        except BaseException as exc:  # noqa: BLE001 — a crashing model is our failure, never the program's
            raise ToolUnavailable(
                f"the {tool} backend crashed: {type(exc).__name__}: {str(exc)[:MAX_TRACE]}"
            ) from None
        if not isinstance(results, list) or len(results) != len(calls):
            raise ToolUnavailable(f"the {tool} backend returned {type(results).__name__} for {len(calls)} calls")
        for result in results:
            try:
                json.dumps(result, allow_nan=False)
            except (TypeError, ValueError, RecursionError) as exc:
                raise ToolUnavailable(f"the {tool} backend returned a result that is not JSON: {exc}") from None
        return results

    # -- pixels ----------------------------------------------------------------------------------
    async def pixels(self, ref: str) -> dict[str, Any]:
        """Pixels of a registered image as `{"shape": [H, W], "data": base64 of H*W*3 bytes}`."""
        self._counts["pixels"] += 1
        self._check_image(ref)
        info = self.images.get(ref)
        loop = asyncio.get_running_loop()
        try:
            arr = await loop.run_in_executor(self._io_pool, info.load_pixels)
        except Exception as exc:  # noqa: BLE001 — an unreadable registered file is our failure
            raise ToolUnavailable(f"cannot read the pixels of image {ref}: {exc}") from None
        arr = np.ascontiguousarray(arr, dtype=np.uint8)
        return {"shape": [int(arr.shape[0]), int(arr.shape[1])], "data": base64.b64encode(arr.tobytes()).decode()}

    def register(self, shape: Any, data: Any, owner: Hashable | None = None) -> list[Any]:
        """Make pixels a program built into a tool-visible image; returns `[ref, width, height]`.

        The image is kept while `owner` (the program's task) holds it: `release(owner)` when the
        program is done. Without an owner it is kept until the store's cap on program images."""
        self._counts["registered"] += 1
        if not (isinstance(shape, list) and len(shape) == 2 and all(type(v) is int and v > 0 for v in shape)):
            raise ToolError(f"register: shape must be [height, width], got {str(shape)[:MAX_TEXT]}")
        if not isinstance(data, str):
            raise ToolError("register: pixel data must be a base64 string")
        height, width = shape
        if height * width * 3 > MAX_REGISTERED_PIXELS:
            raise ToolError(f"register: an image of {height}x{width} is too large")
        try:
            raw = base64.b64decode(data, validate=True)
        except ValueError:
            raise ToolError("register: pixel data is not valid base64") from None
        if len(raw) != height * width * 3:
            raise ToolError(f"register: expected {height * width * 3} bytes of pixels, got {len(raw)}")
        info = self._add_program_image(np.frombuffer(raw, dtype=np.uint8).reshape(height, width, 3).copy(), owner)
        return [info.ref, info.width, info.height]

    def register_array(self, pixels: np.ndarray, owner: Hashable | None = None) -> ImageInfo:
        """`register` for an (H, W, 3) uint8 array already in this process (sandbox: none)."""
        self._counts["registered"] += 1
        return self._add_program_image(pixels, owner)

    def _add_program_image(self, pixels: np.ndarray, owner: Hashable | None) -> ImageInfo:
        if owner is not None and self.images.owned_bytes(owner) + pixels.nbytes > self.max_program_image_bytes:
            raise ToolError(
                f"register: a program may hold at most {self.max_program_image_bytes >> 20} MiB of images it built"
            )
        return self.images.add_array(pixels, owner=owner if owner is not None else _UNOWNED)

    def release(self, owner: Hashable) -> int:
        """The program `owner` is done: forget the images only it built. Returns how many went."""
        evicted = self.images.release(owner)
        self._counts["images_evicted"] += len(evicted)
        return len(evicted)

    # -- videos ----------------------------------------------------------------------------------
    def add_video(
        self, path: str | Path, num_frames: int | None = None, video_id: str | None = None
    ) -> list[ImageInfo]:
        """Frames of a video as dataset images, `num_frames` of them evenly spaced (default: every
        frame, at most MAX_VIDEO_FRAMES). `path` is a video file (decoded with OpenCV) or a
        directory of frame images taken in name order. Frame `i` of the video gets the image id
        `f"{video_id}#{i}"` (video_id defaults to the file or directory name), so annotation
        backends can key scenes per frame. Decoded once per (path, num_frames)."""
        path = Path(path)
        key = (str(path), num_frames)
        if key not in self._videos:
            if not path.exists():
                raise FileNotFoundError(f"video {path} does not exist")
            if num_frames is not None and (
                isinstance(num_frames, bool) or not isinstance(num_frames, int) or num_frames < 1
            ):
                raise ValueError(f"num_frames must be a positive integer, got {num_frames!r}")
            frames = _read_frames(path, num_frames)
            if not frames:
                raise ValueError(f"video {path} has no frames")
            vid = video_id or (path.name if path.is_dir() else path.stem)
            self._videos[key] = [self.images.add_array(pixels, image_id=f"{vid}#{i}") for i, pixels in frames]
        return self._videos[key]

    # -- bookkeeping -----------------------------------------------------------------------------
    def metrics(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self._counts)
        served = out["calls"] - out["tool_errors"]
        out["cache_hit_rate"] = (out["cache_hits"] + out["inflight_hits"]) / served if served > 0 else 0.0
        sizes = self._batch_sizes
        out["batch_sizes"] = dict(sorted(sizes.items()))
        out["mean_batch_size"] = sum(k * v for k, v in sizes.items()) / max(sum(sizes.values()), 1)
        lat = sorted(self._latency)
        out["latency_ms_p50"] = 1000 * statistics.median(lat) if lat else 0.0
        out["latency_ms_p99"] = 1000 * lat[min(int(0.99 * len(lat)), len(lat) - 1)] if lat else 0.0
        out["cache_entries"] = len(self._cache)
        out["images"] = len(self.images)
        return out

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        # A hung backend call must not block shutdown: its thread is abandoned.
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._io_pool.shutdown(wait=False, cancel_futures=True)


def _frame_indices(total: int, num_frames: int | None) -> list[int]:
    want = min(total, num_frames or MAX_VIDEO_FRAMES)
    return sorted({int(round(i)) for i in np.linspace(0, total - 1, num=want)}) if total else []


def _read_frames(path: Path, num_frames: int | None) -> list[tuple[int, np.ndarray]]:
    """`[(index in the video, (H, W, 3) uint8 RGB)]` of the sampled frames."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in FRAME_SUFFIXES)
        return [(i, np.ascontiguousarray(load_rgb(files[i]))) for i in _frame_indices(len(files), num_frames)]
    import cv2  # only the tool host decodes videos; the sandbox never sees this module

    # OpenCV opens by name, and a FIFO or a device there would block it or never end: the path must
    # be a regular file first (anywhere on the machine, as dataset images may be).
    path = check_regular_file(path, roots=[os.sep], max_bytes=MAX_VIDEO_BYTES, base=os.getcwd())
    capture = cv2.VideoCapture(str(path))
    try:
        if not capture.isOpened():
            raise ValueError(f"OpenCV cannot open the video {path}")
        total = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
        if total <= 0:  # some containers do not say: count by decoding, then start again
            while capture.grab():
                total += 1
            capture.release()
            capture = cv2.VideoCapture(str(path))
        wanted = _frame_indices(total, num_frames)
        frames, index = [], 0
        for target in wanted:
            while index <= target:
                if not capture.grab():
                    return frames  # the container promised more frames than it has
                index += 1
            ok, bgr = capture.retrieve()
            if ok:
                frames.append((target, np.ascontiguousarray(bgr[:, :, ::-1])))
        return frames
    finally:
        capture.release()


def _resolve(future: asyncio.Future, result: Any = None, exc: BaseException | None = None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
        future.exception()  # mark retrieved: a call that timed out never awaits it
    else:
        future.set_result(result)
