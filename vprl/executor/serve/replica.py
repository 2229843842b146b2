"""One replica of a served deployment: the stack's backend (built for the deployment's tools alone),
the images it has been sent, and a result cache shared by every client that reaches it.

A request is one tool call: `{"call": ToolCall JSON, "image": {ref, width, height, path, image_id},
"pixels": array or None, "client": str}`. Images cross the wire once per content hash: a replica
that does not know an image, and cannot read its path, answers `{"need_pixels": ref}` and the
client sends it again with the pixels. Answers are `{"result": ...}`, `{"tool_error": message}`
(the program's fault), `{"unavailable": message}` (the backend cannot: ours, not retried) or
`{"need_pixels": ref}`; anything raised is ours too, and the client retries it.
Calls are batched across clients by `@serve.batch` (sizes set from the stack's `serve:` section).
A replica loads its models in its constructor: Serve routes no request to it before that returns,
so a cold load is never spent out of a client's call timeout.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

from ray import serve

from vprl.executor.tools.calls import ToolCall
from vprl.executor.tools.errors import ToolError, ToolUnavailable
from vprl.executor.tools.images import ImageInfo, ImageStore
from vprl.executor.tools.stack import build_backend

MAX_SENT_BYTES = 4 << 30  # pixels a replica keeps of the images clients sent it


class ToolReplica:
    def __init__(self, stack: dict[str, Any], tools: list[str], max_batch_size: int, wait_s: float, cache_size: int):
        self.tools = list(tools)
        self.images = ImageStore()
        self.backend = build_backend(stack, self.images)
        self.preloaded = self.backend.preload()
        self.backend_hash = self.backend.config_hash()
        self.cache: OrderedDict[str, Any] = OrderedDict()
        self.cache_size = cache_size
        self.sent: OrderedDict[str, int] = OrderedDict()  # images received as pixels -> bytes, oldest first
        self.sent_bytes = 0
        self.counts: Counter = Counter()
        self.batches: list[dict[str, Any]] = []  # per batch: its size and how many clients it mixed
        self.batched_call.set_max_batch_size(max_batch_size)
        self.batched_call.set_batch_wait_timeout_s(wait_s)

    async def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        return await self.batched_call(request)

    @serve.batch
    async def batched_call(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        answers: list[dict[str, Any] | None] = [None] * len(requests)
        todo: dict[str, tuple[ToolCall, list[int]]] = {}  # identical calls of one batch run once
        for i, request in enumerate(requests):
            call = ToolCall.from_json(request["call"])
            if call.image is not None and not self._know(request):
                answers[i] = {"need_pixels": call.image}
                continue
            key = call.cache_key(self.backend_hash)
            if key in self.cache:
                self.cache.move_to_end(key)
                self.counts["cache_hits"] += 1
                answers[i] = {"result": self.cache[key]}
            elif key in todo:
                self.counts["merged"] += 1
                todo[key][1].append(i)
            else:
                todo[key] = (call, [i])
        self.counts["calls"] += len(requests)
        self.batches.append({"size": len(requests), "clients": len({r.get("client") for r in requests})})
        for tool in dict.fromkeys(call.tool for call, _ in todo.values()):
            keys = [key for key, (call, _) in todo.items() if call.tool == tool]
            ran = await self._run(tool, [todo[key][0] for key in keys])
            for key, answer in zip(keys, ran, strict=True):
                for i in todo[key][1]:
                    answers[i] = answer
                if "result" in answer:
                    self.cache[key] = answer["result"]
        while len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)
        return answers

    def _know(self, request: dict[str, Any]) -> bool:
        """Whether this replica has the call's image, adding it from the request when it can."""
        meta = request.get("image") or {}
        ref = meta.get("ref")
        if ref in self.images:
            return True
        pixels = request.get("pixels")
        path = meta.get("path")
        if pixels is None and not (path and os.access(path, os.R_OK) and Path(path).is_file()):
            return False
        width, height = int(meta["width"]), int(meta["height"])
        self.images.add(ImageInfo(ref, width, height, path if pixels is None else None, meta.get("image_id"), pixels))
        if pixels is not None:
            # Pixels sent over the wire are the replica's to keep or drop: past the budget the oldest
            # go, and a later call on one asks for it again.
            self.sent[ref] = int(pixels.nbytes)
            self.sent_bytes += int(pixels.nbytes)
            while self.sent_bytes > MAX_SENT_BYTES and len(self.sent) > 1:
                old, size = self.sent.popitem(last=False)
                self.images.forget(old)
                self.sent_bytes -= size
        return True

    async def _run(self, tool: str, calls: list[ToolCall]) -> list[dict[str, Any]]:
        """The backend on the batch (in a thread: a model must not block the replica's loop); a bad
        call is answered alone so it does not fail its batch-mates, as in the tool host."""
        self.counts["backend_calls"] += len(calls)
        try:
            if tool not in self.tools:
                raise ToolUnavailable(f"this deployment answers {', '.join(self.tools)}, not {tool}")
            results = await asyncio.to_thread(self.backend.run, tool, calls)
            return [{"result": r} for r in results]
        except ToolUnavailable as exc:
            return [{"unavailable": str(exc)}] * len(calls)
        except ToolError as exc:
            if len(calls) == 1:
                return [{"tool_error": str(exc)}]
        return [(await self._run(tool, [call]))[0] for call in calls]

    def stats(self) -> dict[str, Any]:
        sizes = [b["size"] for b in self.batches]
        return {
            **{key: self.counts[key] for key in ("calls", "cache_hits", "merged", "backend_calls")},
            "batches": len(sizes),
            "mean_batch": sum(sizes) / len(sizes) if sizes else 0.0,
            "mixed_batches": sum(b["clients"] > 1 for b in self.batches),
            "preloaded": list(self.preloaded),
            "pid": os.getpid(),
        }
