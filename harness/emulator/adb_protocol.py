"""Framing for adb's transport, sync and shell protocols (device side).

References: AOSP `adb/protocol.txt`, `adb/SYNC.TXT`, `adb/file_sync_protocol.h`
and `adb/shell_protocol.h`.

Transport message: a 24-byte little-endian header
``command, arg0, arg1, data_length, data_check, magic`` (``magic`` is
``command ^ 0xffffffff``) followed by ``data_length`` payload bytes. Despite the
name used in some documents, ``data_check`` is a plain byte sum, and hosts that
negotiated version 0x01000001 or later ignore it, so 0 is sent then.

Sync messages are ``id (4 ASCII bytes) + u32 length`` requests; shell protocol
(shell_v2) packets are ``u8 id + u32 length + data``.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Final

# Transport commands (ASCII, little-endian u32).
A_SYNC: Final = 0x434E5953
A_CNXN: Final = 0x4E584E43
A_AUTH: Final = 0x48545541
A_OPEN: Final = 0x4E45504F
A_OKAY: Final = 0x59414B4F
A_CLSE: Final = 0x45534C43
A_WRTE: Final = 0x45545257
A_STLS: Final = 0x534C5453

A_VERSION: Final = 0x01000001
"""Protocol version sent in CNXN; from this version on checksums are skipped."""
A_VERSION_SKIP_CHECKSUM: Final = 0x01000001

MAX_PAYLOAD_BYTES: Final = 1024 * 1024
"""Largest WRTE payload this device accepts (advertised as CNXN arg1)."""

HEADER: Final = struct.Struct("<6I")
_COMMAND_NAMES: Final = {
    A_SYNC: "SYNC", A_CNXN: "CNXN", A_AUTH: "AUTH", A_OPEN: "OPEN",
    A_OKAY: "OKAY", A_CLSE: "CLSE", A_WRTE: "WRTE", A_STLS: "STLS",
}

# Sync protocol ids (SYNC.TXT, file_sync_protocol.h).
SYNC_STAT: Final = b"STAT"  # lstat, v1 reply: mode, size, mtime (u32 each)
SYNC_STA2: Final = b"STA2"  # stat, v2 reply
SYNC_LST2: Final = b"LST2"  # lstat, v2 reply (also answered with id STA2)
SYNC_LIST: Final = b"LIST"
SYNC_LIS2: Final = b"LIS2"
SYNC_DENT: Final = b"DENT"
SYNC_DNT2: Final = b"DNT2"
SYNC_SEND: Final = b"SEND"
SYNC_RECV: Final = b"RECV"
SYNC_DATA: Final = b"DATA"
SYNC_DONE: Final = b"DONE"
SYNC_OKAY: Final = b"OKAY"
SYNC_FAIL: Final = b"FAIL"
SYNC_QUIT: Final = b"QUIT"

SYNC_REQUEST: Final = struct.Struct("<4sI")
SYNC_STAT_V1: Final = struct.Struct("<4sIII")  # id, mode, size, mtime
# id, error, dev, ino, mode, nlink, uid, gid, size, atime, mtime, ctime
SYNC_STAT_V2: Final = struct.Struct("<4sIQQIIIIQqqq")
SYNC_DENT_V1: Final = struct.Struct("<4sIIII")  # id, mode, size, mtime, namelen
# id, error, dev, ino, mode, nlink, uid, gid, size, atime, mtime, ctime, namelen
SYNC_DENT_V2: Final = struct.Struct("<4sIQQIIIIQqqqI")
SYNC_DATA_MAX_BYTES: Final = 64 * 1024
SYNC_PATH_MAX_BYTES: Final = 1024

# Shell protocol (shell_v2) packet ids (shell_protocol.h).
SHELL_STDIN: Final = 0
SHELL_STDOUT: Final = 1
SHELL_STDERR: Final = 2
SHELL_EXIT: Final = 3
SHELL_CLOSE_STDIN: Final = 4
SHELL_WINDOW_SIZE: Final = 5
SHELL_HEADER: Final = struct.Struct("<BI")


class ProtocolError(Exception):
    """The peer sent bytes that are not a valid adb transport message."""


@dataclass(frozen=True)
class Message:
    """One adb transport message (header fields plus payload)."""

    command: int
    arg0: int
    arg1: int
    payload: bytes = b""

    @property
    def name(self) -> str:
        """Return the four-letter command name, or its hex value if unknown."""
        return _COMMAND_NAMES.get(self.command, f"0x{self.command:08x}")

    def encode(self, with_checksum: bool = False) -> bytes:
        """Return header + payload; the check field is 0 unless `with_checksum`."""
        check = (sum(self.payload) & 0xFFFFFFFF) if with_checksum else 0
        header = HEADER.pack(
            self.command, self.arg0, self.arg1, len(self.payload), check,
            self.command ^ 0xFFFFFFFF,
        )
        return header + self.payload


def recv_exact(sock: socket.socket, size: int) -> bytes | None:
    """Return exactly `size` bytes from `sock`, or None if it closed first."""
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def read_message(sock: socket.socket, max_payload_bytes: int = 16 * MAX_PAYLOAD_BYTES
                 ) -> Message | None:
    """Return the next message from `sock`, or None at end of stream.

    Raises ProtocolError on a bad magic or an oversized payload.
    """
    header = recv_exact(sock, HEADER.size)
    if header is None:
        return None
    command, arg0, arg1, length, _check, magic = HEADER.unpack(header)
    if magic != command ^ 0xFFFFFFFF:
        raise ProtocolError(f"bad magic 0x{magic:08x} for command 0x{command:08x}")
    if length > max_payload_bytes:
        raise ProtocolError(f"payload of {length} bytes exceeds {max_payload_bytes}")
    payload = recv_exact(sock, length) if length else b""
    if payload is None:
        return None
    return Message(command, arg0, arg1, payload)


def shell_packet(packet_id: int, data: bytes) -> bytes:
    """Return one shell_v2 packet: u8 id, u32 length, data."""
    return SHELL_HEADER.pack(packet_id, len(data)) + data


def sync_fail(message: str) -> bytes:
    """Return a sync FAIL reply carrying `message`."""
    raw = message.encode("utf-8", "replace")
    return SYNC_REQUEST.pack(SYNC_FAIL, len(raw)) + raw
