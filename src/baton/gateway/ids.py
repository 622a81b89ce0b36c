"""Request ids the gateway makes: unique in this process and unguessable across processes
(a random prefix per gateway, then a counter), without a system call per id as uuid4 has."""

from __future__ import annotations

import itertools
import os


class IdSource:
    """``next()`` gives a fresh 32-hex-digit id."""

    def __init__(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._count = itertools.count(1)

    def next(self) -> str:
        return f"{self._prefix}{next(self._count):016x}"
