"""The framing of the user-code worker's protocol (user_worker.py): a 4-byte big-endian length, then a pickle."""

from __future__ import annotations

import os
import pickle
import struct
from typing import Any

HEADER = struct.Struct(">I")


def read_exact(fd: int, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> Any:
    header = read_exact(fd, HEADER.size)
    if header is None:
        return None
    body = read_exact(fd, HEADER.unpack(header)[0])
    return None if body is None else pickle.loads(body)


def write_frame(fd: int, message: Any) -> None:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    data = HEADER.pack(len(body)) + body
    while data:
        data = data[os.write(fd, data) :]
