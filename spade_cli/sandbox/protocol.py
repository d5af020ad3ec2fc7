"""Frames between the supervisor and its sandboxed processes: 4-byte length + msgpack.

Both directions carry one msgpack map per frame, prefixed by its length as a big-endian uint32.
msgpack decodes to plain types only (dict, list, str, bytes, int, float, bool, None): nothing an
env process sends can run code in the supervisor, which is why pickle and ``eval`` never appear
here. The reader refuses frames larger than a cap *before* reading their body, so a flood on the
protocol channel costs at most one cap of memory.

The supervisor side (``FrameReader``) is non-blocking and deadline-driven: it waits with
``select.poll`` on the protocol socket and, at the same time, drains the env's stdout/stderr pipe
into a capped sink, so a chatty env can never fill its pipe and stall a reply we are waiting for.
"""

from __future__ import annotations

import os
import select
import struct
import time

import msgpack

HEADER = struct.Struct(">I")


class FrameError(Exception):
    """A broken channel. ``kind`` is "eof", "timeout", "too_large", "garbled" or "output_flood"."""

    def __init__(self, kind: str, detail: str = ""):
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind, self.detail = kind, detail


def pack(obj: dict) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    return HEADER.pack(len(body)) + body


def unpack(body: bytes) -> dict:
    try:
        obj = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise FrameError("garbled", f"{type(exc).__name__}: {exc}") from None
    if not isinstance(obj, dict):
        raise FrameError("garbled", f"a frame must be a map, got {type(obj).__name__}")
    return obj


def send(fd: int, obj: dict) -> None:
    """Blocking write of one whole frame (used by both sides; frames sent to envs are small)."""
    view = memoryview(pack(obj))
    while view:
        n = os.write(fd, view)
        view = view[n:]


def recv_blocking(fd: int, max_bytes: int) -> dict:
    """Blocking read of one frame; the side inside the sandbox uses this."""
    head = _read_exact(fd, HEADER.size)
    (size,) = HEADER.unpack(head)
    if size > max_bytes:
        raise FrameError("too_large", f"{size} bytes")
    return unpack(_read_exact(fd, size))


def _read_exact(fd: int, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            raise FrameError("eof")
        buf += chunk
    return bytes(buf)


class OutputSink:
    """Keeps the tail of an env's stdout/stderr and counts every byte it was sent."""

    def __init__(self, keep: int = 8192):
        self.keep, self.total, self.tail = keep, 0, b""

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        self.tail = (self.tail + data)[-self.keep:]

    def text(self) -> str:
        return self.tail.decode("utf-8", "replace")


class FrameReader:
    """Supervisor-side reader of one non-blocking protocol fd plus an optional output pipe."""

    def __init__(self, fd: int, out_fd: int | None, sink: OutputSink, max_frame: int, max_output: int):
        self.fd, self.out_fd, self.sink = fd, out_fd, sink
        self.max_frame, self.max_output = max_frame, max_output
        self.buf = bytearray()
        os.set_blocking(fd, False)
        if out_fd is not None:
            os.set_blocking(out_fd, False)
        self.poller = select.poll()
        self.poller.register(fd, select.POLLIN)
        if out_fd is not None:
            self.poller.register(out_fd, select.POLLIN)

    def _drain_output(self) -> None:
        while self.out_fd is not None:
            try:
                data = os.read(self.out_fd, 1 << 16)
            except BlockingIOError:
                return
            if not data:  # the env closed its end; stop watching it
                self.poller.unregister(self.out_fd)
                os.close(self.out_fd)
                self.out_fd = None
                return
            self.sink.feed(data)
            if self.sink.total > self.max_output:
                raise FrameError("output_flood", f"more than {self.max_output} bytes of stdout/stderr")

    def _frame_ready(self) -> dict | None:
        if len(self.buf) < HEADER.size:
            return None
        (size,) = HEADER.unpack_from(self.buf)
        if size > self.max_frame:
            raise FrameError("too_large", f"a {size}-byte frame (cap {self.max_frame})")
        if len(self.buf) < HEADER.size + size:
            return None
        body = bytes(self.buf[HEADER.size:HEADER.size + size])
        del self.buf[:HEADER.size + size]
        return unpack(body)

    def read(self, deadline: float) -> dict:
        """One frame, or FrameError when the deadline (a ``time.monotonic`` value) passes first."""
        while True:
            frame = self._frame_ready()
            if frame is not None:
                return frame
            left = deadline - time.monotonic()
            if left <= 0:
                raise FrameError("timeout")
            events = self.poller.poll(max(1, int(left * 1000)) if left < 3600 else 3600_000)
            for fd, _ev in events:
                if fd == self.out_fd:
                    self._drain_output()
                    continue
                try:
                    data = os.read(self.fd, 1 << 20)
                except BlockingIOError:
                    continue
                if not data:
                    self._drain_output()
                    raise FrameError("eof")
                self.buf += data
                if len(self.buf) > self.max_frame + HEADER.size:
                    self._frame_ready()  # raises too_large for an oversized header
