"""A writer process for the SIGKILL test: writes verifiable objects until it is killed.

Run as ``python -m relayrl.core.testing.kill_writer URL SEED MAX_BYTES``. Each object's content is
a deterministic function of its first 8 bytes, so a reader can check any object it sees without
knowing which writes completed: a partial or torn object fails either the store's checksum or
:func:`expected_content`.
"""

from __future__ import annotations

import random
import struct
import sys

_BLOCK = 4096


def expected_content(ident: int, size: int) -> bytes:
    """The bytes object ``ident`` of ``size`` bytes must hold."""
    block = random.Random(ident).randbytes(_BLOCK)
    header = struct.pack("<QQ", ident, size)
    body_size = max(0, size - len(header))
    return header + (block * (body_size // _BLOCK + 1))[:body_size]


def check_object(data: bytes) -> int:
    """Raise AssertionError unless ``data`` is a complete object; return its ident."""
    assert len(data) >= 16, f"object of {len(data)} bytes is shorter than its header"
    ident, size = struct.unpack_from("<QQ", data)
    assert size == len(data), f"object {ident}: {len(data)} bytes, header says {size}"
    assert data == expected_content(ident, size), f"object {ident}: content differs from what was written"
    return ident


def main(url: str, seed: int, max_bytes: int) -> None:
    from relayrl.core.store import open_store

    store = open_store(url)
    rng = random.Random(seed)
    ident = seed * 1_000_000
    while True:
        ident += 1
        size = rng.randint(16, max_bytes)
        data = expected_content(ident, size)
        store.put(f"objects/{ident:012d}", data)          # a new object
        store.put("hot", data)                            # an overwrite of the same key
        if not store.exists(f"once/{ident % 7}"):
            store.put(f"once/{ident % 7}", data, if_absent=True)  # a conditional create
        print(ident, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
