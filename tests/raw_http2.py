"""A gRPC caller of our own over a bare socket, as an attacker would write one: HTTP/2 frames
by hand, and a receive window it never opens, so that the server's replies stay unread.

Only what the tests need: the preface, SETTINGS (the window of each stream), HEADERS with
literal fields (HPACK without indexing or Huffman), one DATA frame a call, and a reader that
acknowledges SETTINGS and PING and notes which streams ended, never sending WINDOW_UPDATE.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PING = 0x0, 0x1, 0x3, 0x4, 0x6
_END_STREAM, _ACK, _END_HEADERS = 0x1, 0x1, 0x4
_SETTINGS_INITIAL_WINDOW_SIZE = 0x4


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, stream) + payload


def _hpack_integer(value: int, prefix_bits: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([value])
    out, value = [limit], value - limit
    while value >= 128:
        out.append(value & 127 | 128)
        value >>= 7
    return bytes([*out, value])


def _literal_field(name: str, value: str) -> bytes:
    """A header field literal without indexing, its name and value as plain octets."""
    encoded_name, encoded_value = name.encode(), value.encode()
    return (
        b"\x00"
        + _hpack_integer(len(encoded_name), 7)
        + encoded_name
        + _hpack_integer(len(encoded_value), 7)
        + encoded_value
    )


class UnreadingCaller:
    """One HTTP/2 connection to `host:port` whose streams each may receive `window` bytes."""

    def __init__(self, host: str, port: int, window: int = 0):
        self._socket = socket.create_connection((host, port), timeout=10)
        self._authority = f"{host}:{port}"
        self._lock = threading.Lock()
        self._next_stream = 1
        self.ended: set[int] = set()  # streams the server ended or reset
        settings = struct.pack(">HI", _SETTINGS_INITIAL_WINDOW_SIZE, window)
        self._socket.sendall(_PREFACE + _frame(_SETTINGS, 0, 0, settings))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def call(self, method_path: str, request: bytes, metadata=()) -> int:
        """Sends a unary call; returns its stream."""
        fields = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", method_path),
            (":authority", self._authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            *metadata,
        ]
        block = b"".join(_literal_field(name, value) for name, value in fields)
        message = b"\x00" + struct.pack(">I", len(request)) + request  # not compressed
        with self._lock:
            stream, self._next_stream = self._next_stream, self._next_stream + 2
            self._socket.sendall(
                _frame(_HEADERS, _END_HEADERS, stream, block)
                + _frame(_DATA, _END_STREAM, stream, message)
            )
        return stream

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)  # ends the reader's blocked recv
        self._socket.close()
        self._reader.join(timeout=10)

    def __enter__(self) -> UnreadingCaller:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _read(self) -> None:
        self._socket.settimeout(None)
        with contextlib.suppress(EOFError, OSError):
            while True:
                head = self._receive(9)
                length = int.from_bytes(head[:3], "big")
                kind, flags, stream = struct.unpack(">BBI", head[3:])
                stream &= 0x7FFFFFFF
                payload = self._receive(length)
                if kind in (_SETTINGS, _PING) and not flags & _ACK:
                    with self._lock:
                        self._socket.sendall(
                            _frame(kind, _ACK, 0, payload if kind == _PING else b"")
                        )
                if stream and (kind == _RST_STREAM or (kind in (_DATA, _HEADERS) and flags & 1)):
                    self.ended.add(stream)

    def _receive(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self._socket.recv(size - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data
