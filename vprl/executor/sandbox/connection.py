"""The runner's end of the supervisor: start it as a clean process and exchange frames with it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
from typing import Any

from vprl.executor.sandbox import framing
from vprl.executor.sandbox.child import Limits
from vprl.executor.sandbox.probe import LAYERS
from vprl.paths import IMPORT_ROOT

# `-I`: no PYTHON* variables, no user site, no cwd on the path. The environment is rebuilt from
# nothing, so tokens (HF_TOKEN, WANDB_API_KEY, ...) of the trainer never reach a sandbox. The folder
# that holds our vprl goes first, so the supervisor is this vprl even where -I hides how we found it.
BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from vprl.executor.sandbox.supervisor import main; sys.exit(main(sys.argv[1:]))"
)
CLEAN_ENV = {
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "CUDA_VISIBLE_DEVICES": "",
}


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot run here (a required isolation layer is missing); the message says why."""


class SupervisorConnection:
    def __init__(self, proc: subprocess.Popen, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hello):
        self.proc = proc
        self.reader = reader
        self.writer = writer
        self.layers: dict[str, str] = hello["layers"]
        self.pid: int = hello["pid"]
        self.root: str = hello["root"]
        self.spawn: str = hello.get("spawn", "fork")
        self.isolation: str = hello.get("isolation", "full")  # "full" or "restricted" (restricted.py)
        self.notice: str | None = hello.get("notice")  # the one line announcing the restricted mode

    @classmethod
    async def start(
        cls,
        slots: int,
        limits: Limits,
        require_layers: tuple[str, ...] = LAYERS,
        startup_timeout: float = 60.0,
        spawn: str = "clone",
        sandbox: str = "full",
    ) -> SupervisorConnection:
        ours, theirs = socket.socketpair()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-c", BOOT, str(IMPORT_ROOT), str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                env=CLEAN_ENV,
                cwd="/",
                stdin=subprocess.DEVNULL,
                # A session (and process group) of its own: a program that ever reached the
                # supervisor's group must not take the trainer's with it. The supervisor still
                # dies with the runner (PDEATHSIG), not with a terminal's Ctrl-C.
                start_new_session=True,
            )
        finally:
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=ours, limit=1 << 20)
        writer.write(
            framing.encode(
                {
                    "slots": slots,
                    "limits": limits.to_json(),
                    "require_layers": list(require_layers),
                    "spawn": spawn,
                    "sandbox": sandbox,
                }
            )
        )
        await writer.drain()
        try:
            hello = await asyncio.wait_for(read_frame(reader), startup_timeout)
        except (asyncio.IncompleteReadError, TimeoutError, ConnectionError) as exc:
            proc.kill()
            proc.wait()
            writer.close()
            raise SandboxUnavailable(
                f"the sandbox supervisor did not start (exit code {proc.poll()}): {exc!r}"
            ) from None
        if hello.get("op") == "fatal":
            proc.wait()
            writer.close()
            raise SandboxUnavailable(hello["message"])
        return cls(proc, reader, writer, hello)

    async def send(self, frame: dict[str, Any]) -> None:
        self.writer.write(framing.encode(frame))
        await self.writer.drain()

    async def recv(self) -> dict[str, Any]:
        return await read_frame(self.reader)

    async def close(self, timeout: float = 10.0) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):  # already gone
            await self.send({"op": "shutdown"})
        # Polled rather than waited on in the loop's thread pool: a session closed at exit (atexit
        # runs after the interpreter stops the pools) must still stop its supervisor.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.proc.poll() is None and loop.time() < deadline:
            await asyncio.sleep(0.02)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()  # a killed process is reaped at once
        self.writer.close()

    def alive(self) -> bool:
        return self.proc.poll() is None and os.path.exists(f"/proc/{self.proc.pid}")


async def read_frame(reader: asyncio.StreamReader, max_frame: int = 256 << 20) -> dict[str, Any]:
    (size,) = framing.HEADER.unpack(await reader.readexactly(framing.HEADER.size))
    if size > max_frame:
        raise framing.FrameTooLarge(f"frame of {size} bytes from the supervisor")
    return framing.decode_body(await reader.readexactly(size))
