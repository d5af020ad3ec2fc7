"""Frames between the supervisor and its sandboxed processes: 4-byte length + msgpack, typed.

Both directions carry one msgpack map per frame, prefixed by its length as a big-endian uint32.
Every frame an env process sends is untrusted, because the env's own code runs in that process and
can write on the protocol socket: the supervisor decodes each reply with msgspec against the one
schema its request allows (``expect(Step)`` accepts a ``StepDone`` or a ``Failed`` and nothing
else: wrong types, unknown fields or another tag are a ``FrameError("garbled")``). msgspec decodes
to plain types only, so nothing an env sends can run code in the supervisor; pickle and ``eval``
never appear here. The reader refuses frames larger than a cap *before* reading their body, so a
flood on the protocol channel costs at most one cap of memory.

Requests are numbered per process and every reply echoes its request's number, so a frame an
env writes on top of its real reply (or after it) is caught as out of turn at the next read
rather than taken as the answer to a later request.

The first frame of every env process is ``Ready`` or ``SetupFailed``, sent by the launcher after
confinement and before any env code exists in the process; it is read before ``Load`` is sent.
So a setup failure can only be reported by trusted code: a ``SetupFailed`` that arrives later is
just a frame of the wrong type.

The supervisor side (``FrameReader``) is deadline-driven: it waits in a blocking read of the
protocol socket, in slices of ``SLICE`` seconds (``SO_RCVTIMEO``), and drains the env's
stdout/stderr pipe into a capped sink between slices. A blocking read is the fastest wake-up a
reply can get: ``poll`` and then ``read`` cost 20 to 25 us more per round trip when the two
processes sit on different cores (45 against 25 us on this project's 2-core machine). A chatty env
can still not stall a reply: once a slice finds output waiting, the rest of that wait is a
``poll`` on the socket and the pipe together, draining the pipe as it fills.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time
from typing import Any

import msgspec

HEADER = struct.Struct(">I")
# How long one blocking read or write of the supervisor waits before it looks at the env's output
# pipe and its deadline again.
SLICE = 0.02
# The env side of this module runs in the env's interpreter, where the env may patch builtins
# (``builtins.len = ...``): the names it uses are bound here, at import, in the zygote.
len, memoryview, bytes = len, memoryview, bytes  # noqa: PLW0127


class FrameError(Exception):
    """A broken channel. ``kind`` is "eof", "timeout", "too_large", "garbled" or "output_flood"."""

    def __init__(self, kind: str, detail: str = ""):
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind, self.detail = kind, detail


# -- requests (trusted: supervisor -> env process) ------------------------------------------------

class _Req(msgspec.Struct, tag_field="op", forbid_unknown_fields=True, kw_only=True):
    n: int = 0  # the request's number in its process; the reply echoes it


class Load(_Req, tag="load"):
    code: str
    compiled: bytes | None = None  # the code object, marshalled by the supervisor (then code is "")


class Reset(_Req, tag="reset"):
    seed: int
    options: dict | None = None


class Step(_Req, tag="step"):
    action: str


class CheckEnv(_Req, tag="check_env"):
    pass


# -- replies (untrusted: env process -> supervisor) ------------------------------------------------

class _Reply(msgspec.Struct, tag_field="t", forbid_unknown_fields=True, kw_only=True):
    n: int = 0  # echoes the request's number: a reply to an earlier request is a frame out of turn


class Ready(_Reply, tag="ready"):
    scratch: str  # "tmpfs" (a private, size-capped mount), "budget" (checked by the supervisor), "none"


class SetupFailed(_Reply, tag="setup_failed"):
    detail: str


class Loaded(_Reply, tag="loaded"):
    cls: str


class ResetDone(_Reply, tag="reset"):
    obs: str
    info: dict[str, Any]


class StepDone(_Reply, tag="step"):
    obs: str
    reward: float
    term: bool
    trunc: bool
    info: dict[str, Any]


class Checked(_Reply, tag="checked"):
    error: str | None = None
    skipped: str | None = None
    warnings: list[str] = []


class Failed(_Reply, tag="err"):
    reason: str
    detail: str = ""


REQUESTS = msgspec.msgpack.Decoder(Load | Reset | Step | CheckEnv)
HELLO = msgspec.msgpack.Decoder(Ready | SetupFailed)
REPLIES = {Load: msgspec.msgpack.Decoder(Loaded | Failed), Reset: msgspec.msgpack.Decoder(ResetDone | Failed),
           Step: msgspec.msgpack.Decoder(StepDone | Failed), CheckEnv: msgspec.msgpack.Decoder(Checked | Failed)}
_encode_into = msgspec.msgpack.Encoder().encode_into


def pack(obj: Any) -> bytearray:
    """One frame: the body encoded straight after room for its length (no second copy)."""
    frame = bytearray(HEADER.size)
    _encode_into(obj, frame, HEADER.size)
    HEADER.pack_into(frame, 0, len(frame) - HEADER.size)
    return frame


def unpack(body: bytes, decoder: msgspec.msgpack.Decoder | None = None) -> Any:
    """A typed message (``decoder``), or a plain map (the zygote's control channel)."""
    try:
        obj = decoder.decode(body) if decoder is not None else msgspec.msgpack.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise FrameError("garbled", str(exc)[:300]) from None
    except (RecursionError, MemoryError) as exc:  # a frame nested past the decoder's stack, by design
        raise FrameError("garbled", f"{type(exc).__name__} while decoding") from None
    if decoder is None and not isinstance(obj, dict):
        raise FrameError("garbled", f"a frame must be a map, got {type(obj).__name__}")
    return obj


def send(fd: int, obj: Any) -> None:
    """Blocking write of one whole frame (used by both sides; frames sent to envs are small)."""
    frame = pack(obj)
    n = os.write(fd, frame)
    if n < len(frame):  # a frame larger than the socket buffer: finish it piece by piece
        view = memoryview(frame)[n:]
        while view:
            view = view[os.write(fd, view):]


class BlockingReader:
    """The env side's reader: one ``read`` call usually brings a whole request."""

    def __init__(self, fd: int, max_bytes: int):
        self.fd, self.max_bytes, self.buf = fd, max_bytes, bytearray()

    def recv(self) -> bytes | memoryview:
        if not self.buf:  # the usual case: one read brings exactly one whole frame
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                raise FrameError("eof")
            if len(chunk) >= HEADER.size and HEADER.unpack_from(chunk)[0] == len(chunk) - HEADER.size:
                if len(chunk) - HEADER.size > self.max_bytes:
                    raise FrameError("too_large", f"{len(chunk) - HEADER.size} bytes")
                return memoryview(chunk)[HEADER.size:]
            self.buf += chunk
        while True:
            if len(self.buf) >= HEADER.size:
                (size,) = HEADER.unpack_from(self.buf)
                if size > self.max_bytes:
                    raise FrameError("too_large", f"{size} bytes")
                if len(self.buf) >= HEADER.size + size:
                    body = bytes(self.buf[HEADER.size:HEADER.size + size])
                    del self.buf[:HEADER.size + size]
                    return body
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                raise FrameError("eof")
            self.buf += chunk


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
    """Supervisor-side reader of one protocol socket plus an optional output pipe.

    ``max_output`` caps what this one process may print; ``sink`` may be shared by several
    readers (the processes of one env) so its tail shows the latest output of any of them. The
    socket becomes blocking with ``SLICE``-second send and receive timeouts (the supervisor's writes
    keep their deadline with them); the pipe is drained between slices and whenever the socket ends.
    """

    def __init__(self, fd: int, out_fd: int | None, sink: OutputSink, max_frame: int, max_output: int):
        self.fd, self.out_fd, self.sink = fd, out_fd, sink
        self.max_frame, self.max_output, self.printed = max_frame, max_output, 0
        self.buf = bytearray()
        os.set_blocking(fd, True)
        sock = socket.socket(fileno=fd)  # a view of the fd, to set its options; detached below
        try:
            slice_ = struct.pack("ll", 0, int(SLICE * 1e6))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, slice_)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, slice_)
        finally:
            sock.detach()
        if out_fd is not None:
            os.set_blocking(out_fd, False)

    def drain_output(self) -> int:
        """Move what the pipe holds to the sink; returns the bytes moved."""
        moved = 0
        while self.out_fd is not None:
            try:
                data = os.read(self.out_fd, 1 << 16)
            except BlockingIOError:
                break
            if not data:  # the env closed its end; stop watching it
                os.close(self.out_fd)
                self.out_fd = None
                break
            self.sink.feed(data)
            self.printed += len(data)
            moved += len(data)
            if self.printed > self.max_output:
                raise FrameError("output_flood", f"more than {self.max_output} bytes of stdout/stderr")
        return moved

    def _wait_chatty(self, deadline: float) -> None:
        """Until the socket is readable or the deadline: ``poll`` on the socket and the pipe,
        draining the pipe as it fills. Used once a slice found output waiting, so an env that
        prints without pause is read as fast as it writes (and a flood is seen at once)."""
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        while self.out_fd is not None:
            poller.register(self.out_fd, select.POLLIN)
            left = deadline - time.monotonic()
            if left <= 0:
                return
            events = dict(poller.poll(max(1, int(min(left, 3600) * 1000))))
            if self.fd in events:
                return
            poller.unregister(self.out_fd)
            self.drain_output()

    def _frame_ready(self) -> bytes | None:
        if len(self.buf) < HEADER.size:
            return None
        (size,) = HEADER.unpack_from(self.buf)
        if size > self.max_frame:
            raise FrameError("too_large", f"a {size}-byte frame (cap {self.max_frame})")
        if len(self.buf) < HEADER.size + size:
            return None
        body = bytes(self.buf[HEADER.size:HEADER.size + size])
        del self.buf[:HEADER.size + size]
        return body

    def read(self, deadline: float) -> bytes | memoryview:
        """One frame's body, or FrameError when the deadline (``time.monotonic``) passes first
        (noticed within one ``SLICE``)."""
        while True:
            body = self._frame_ready()
            if body is not None:
                return body
            try:
                data = os.read(self.fd, 1 << 16)  # not 1 MiB: a buffer that size is an mmap per call
            except BlockingIOError:  # a slice passed with nothing to read
                if self.drain_output():
                    self._wait_chatty(deadline)
                if time.monotonic() >= deadline:
                    raise FrameError("timeout") from None
                continue
            except OSError:
                data = b""  # ECONNRESET and the like: the process is gone
            if not data:
                self.drain_output()
                raise FrameError("eof")
            if not self.buf and len(data) >= HEADER.size:  # one read, one whole frame: no copy
                (size,) = HEADER.unpack_from(data)
                if size == len(data) - HEADER.size and size <= self.max_frame:
                    return memoryview(data)[HEADER.size:]
            self.buf += data
            if len(self.buf) > self.max_frame + HEADER.size:
                self._frame_ready()  # raises too_large for an oversized header
