"""The `serve` tool backend: the tool host's calls answered by a tool service on Ray Serve.

The host keeps what it does in-process (validation, in-flight merging, its local cache, batching);
this backend sends each call of a batch as one request, concurrently, to the tool's deployment,
where requests from every client are batched together and answered from a cache all clients share.
An image is named by its content hash; its pixels go only to a replica that asks for them.

Tool calls are pure, so a call whose replica died or did not answer is sent again, with backoff,
until `rpc_timeout_s`; past it the call is `ToolUnavailable`, which the runner reports as
`infra_error` (masked, never scored).
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any, ClassVar

from vprl.executor.limits import MAX_MESSAGE
from vprl.executor.serve.deploy import ServiceUnavailable, connect, served_settings
from vprl.executor.tools.base import ToolBackend
from vprl.executor.tools.calls import ToolCall
from vprl.executor.tools.errors import ToolError, ToolUnavailable
from vprl.executor.tools.images import ImageStore
from vprl.executor.tools.stack import backend_class, read_tool_stack, stack_settings


class ServedBackend(ToolBackend):
    name: ClassVar[str] = "serve"
    max_concurrent_batches: ClassVar[int] = 16  # batches of different tools go out at once

    def __init__(
        self,
        images: ImageStore,
        stack: str | dict[str, Any] = "",
        address: str = "auto",
        rpc_timeout_s: float = 60.0,
        retry_s: float = 0.2,
    ) -> None:
        stack = stack if isinstance(stack, dict) else read_tool_stack(stack)
        super().__init__(images, stack=stack.get("_source", ""), address=address)
        self.settings = served_settings(stack)
        self.rpc_timeout_s = rpc_timeout_s
        self.retry_s = retry_s
        # The same key the stack's own backend would give its results: served and in-process
        # answers are the same answers.
        self._hash = backend_class(stack["backend"])(images, **stack_settings(stack, {})).config_hash()
        self.address = connect(address)
        self.client = f"{socket.gethostname()}:{os.getpid()}"
        self.handles = self._handles()
        self.retries = 0

    def _handles(self) -> dict[str, Any]:
        from ray import serve

        try:
            running = {name for name, app in serve.status().applications.items() if app.status == "RUNNING"}
        except Exception as exc:  # noqa: BLE001 — any failure to reach Serve means there is no service
            raise ServiceUnavailable(f"no tool service on the Ray cluster at {self.address}: {exc}") from None
        missing = [tool for tool in self.settings.tools if self.settings.app_of(tool) not in running]
        if missing:
            raise ServiceUnavailable(
                f"the tool service at {self.address} does not deploy {', '.join(missing)} "
                f"(applications {', '.join(dict.fromkeys(self.settings.app_of(t) for t in missing))}); deploy the "
                "stack with `python -m vprl.executor.serve --tool_stack <stack> --address auto`"
            )
        apps = {name: serve.get_app_handle(self.settings.app(name)) for name in self.settings.placements}
        self.deployments = apps
        return {tool: apps[self.settings.deployment_of(tool)] for tool in self.settings.tools}

    def config_hash(self) -> str:
        return self._hash

    def supports(self, tool: str) -> bool:
        return tool in self.handles

    def _request(self, call: ToolCall, pixels: bool) -> dict[str, Any]:
        request: dict[str, Any] = {"call": call.to_json(), "client": self.client, "image": None, "pixels": None}
        if call.image is not None:
            info = self.images.get(call.image)
            request["image"] = {
                "ref": info.ref,
                "width": info.width,
                "height": info.height,
                "path": info.path,
                "image_id": info.image_id,
            }
            if pixels:
                request["pixels"] = info.load_pixels()
        return request

    def run(self, tool: str, calls: list[ToolCall]) -> list[Any]:
        if not self.supports(tool):
            raise ToolUnavailable(f"the tool service has no {tool!r} tool")
        handle = self.handles[tool]
        deadline = time.monotonic() + self.rpc_timeout_s
        answers: list[dict[str, Any] | None] = [None] * len(calls)
        pending = {i: self._request(call, pixels=False) for i, call in enumerate(calls)}
        delay = self.retry_s
        while pending:
            sent = {i: handle.remote(request) for i, request in pending.items()}
            again: dict[int, dict[str, Any]] = {}
            failed: BaseException | None = None
            for i, response in sent.items():
                try:
                    answer = response.result(timeout_s=max(deadline - time.monotonic(), 0.01))
                except Exception as exc:  # noqa: BLE001 — a dead or unreachable replica: the call is pure, send it again
                    failed = exc
                    again[i] = pending[i]
                    continue
                if "need_pixels" in answer:
                    again[i] = self._request(calls[i], pixels=True)
                else:
                    answers[i] = answer
            if failed is not None:
                if time.monotonic() >= deadline:
                    raise ToolUnavailable(
                        f"the tool service did not answer {len(again)} {tool} call(s) within {self.rpc_timeout_s:g} s "
                        f"(last error: {type(failed).__name__}: {str(failed)[:MAX_MESSAGE]})"
                    )
                self.retries += 1
                time.sleep(min(delay, max(deadline - time.monotonic(), 0.0)))
                delay = min(delay * 2, 5.0)
            pending = again
        return [_unwrap(tool, answer) for answer in answers]

    def preload(self) -> list[str]:
        """Nothing loads here: each replica loaded its models before Serve routed it a call, which the
        deployments being RUNNING (checked when this backend was built) implies. Returns what they hold."""
        return [f"{item} (served by {name})" for name, stats in self.metrics().items() for item in stats["preloaded"]]

    def metrics(self) -> dict[str, Any]:
        """What a replica of each deployment reports (calls, cache hits, batches, mixed batches)."""
        return {name: handle.stats.remote().result(timeout_s=10) for name, handle in self.deployments.items()}


def _unwrap(tool: str, answer: dict[str, Any] | None) -> Any:
    if answer is None:  # not possible once the loop has ended; kept as a guard on the protocol
        raise ToolUnavailable(f"the tool service gave no answer to a {tool} call")
    if "tool_error" in answer:
        raise ToolError(answer["tool_error"])
    if "unavailable" in answer:
        raise ToolUnavailable(answer["unavailable"])
    return answer["result"]
