"""Length-prefixed JSON frames: the only format that crosses a sandbox boundary.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON. Readers enforce a
size cap *before* buffering a frame, and decoding never runs code chosen by the sender (no pickle).
The encoder and the `struct`/`os` functions are captured when this module is imported, so a program
that monkeypatches `json.dumps`, `struct.pack` or `len` cannot break the frames it sends.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

HEADER = struct.Struct(">I")
_pack = HEADER.pack
_unpack = HEADER.unpack
_write = os.write
_len = len
_min = min
_bytes = bytes
_read = os.read
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_encode = _ENCODER.encode
_DECODER = json.JSONDecoder()
_decode = _DECODER.decode


class FrameError(Exception):
    """A frame that is too large, truncated, or not JSON: the peer broke the protocol."""


class FrameTooLarge(FrameError):
    pass


def encode(obj: Any) -> bytes:
    """One frame. Lone surrogates (from hostile strings) become '?' instead of failing."""
    data = _encode(obj).encode("utf-8", "replace")
    return _pack(_len(data)) + data


def decode_body(body: bytes) -> Any:
    try:
        return _decode(body.decode("utf-8"))
    except (ValueError, RecursionError, UnicodeDecodeError, MemoryError) as exc:
        raise FrameError(f"frame is not valid JSON ({type(exc).__name__})") from None


class FrameReader:
    """Incremental reader for a non-blocking stream: `feed(bytes)` returns the complete frames.

    A bad frame does not hide the good frames before it (they are returned); it sets `error`, and
    the reader accepts nothing more.
    """

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self.error: FrameError | None = None
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Any]:
        if self.error is not None:
            return []
        self._buf += data
        frames = []
        try:
            while _len(self._buf) >= HEADER.size:
                (size,) = _unpack(_bytes(self._buf[: HEADER.size]))
                if size > self.max_frame:
                    raise FrameTooLarge(f"frame of {size} bytes exceeds the cap of {self.max_frame}")
                if _len(self._buf) < HEADER.size + size:
                    break
                body = _bytes(self._buf[HEADER.size : HEADER.size + size])
                del self._buf[: HEADER.size + size]
                frames.append(decode_body(body))
        except FrameError as exc:
            self.error = exc
            self._buf.clear()
        return frames

    @property
    def pending(self) -> int:
        return len(self._buf)


def send_blocking(fd: int, obj: Any) -> None:
    view = memoryview(encode(obj))
    while view:
        n = _write(fd, view)
        view = view[n:]


def recv_blocking(fd: int, max_frame: int) -> Any:
    (size,) = _unpack(_read_exact(fd, HEADER.size))
    if size > max_frame:
        raise FrameTooLarge(f"frame of {size} bytes exceeds the cap of {max_frame}")
    return decode_body(_read_exact(fd, size))


def _read_exact(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        chunk = _read(fd, _min(n, 1 << 20))
        if not chunk:
            raise FrameError("channel closed in the middle of a frame")
        chunks.append(chunk)
        n -= _len(chunk)
    return b"".join(chunks)
