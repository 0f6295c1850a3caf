"""Counters shared by the sustained benchmark and its producer and consumer
processes, whatever their interpreter: three 64-bit integers in a file
mapped into each process (enqueued, done, stop). Standard library only, so
the peers' virtualenvs can import it.

Each counter has one writer (the producer writes ``enqueued``, the one
consumer process ``done`` from one thread, the benchmark ``stop``); an
aligned 8-byte store is read whole on the machines this runs on.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

_FIELDS = ("enqueued", "done", "stop")


class Counters:
    def __init__(self, path: str | Path, *, create: bool = False) -> None:
        self.path = str(path)
        if create:
            Path(path).write_bytes(bytes(8 * len(_FIELDS)))
        with open(path, "r+b") as file:
            self._map = mmap.mmap(file.fileno(), 8 * len(_FIELDS))

    def _get(self, index: int) -> int:
        return int(struct.unpack_from("q", self._map, 8 * index)[0])

    def _set(self, index: int, value: int) -> None:
        struct.pack_into("q", self._map, 8 * index, value)

    @property
    def enqueued(self) -> int:
        return self._get(0)

    @enqueued.setter
    def enqueued(self, value: int) -> None:
        self._set(0, value)

    @property
    def done(self) -> int:
        return self._get(1)

    @done.setter
    def done(self, value: int) -> None:
        self._set(1, value)

    @property
    def stopped(self) -> bool:
        return self._get(2) != 0

    def stop(self) -> None:
        self._set(2, 1)
