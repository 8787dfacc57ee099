"""Buffer ingest benchmark: committed rollout segments to pending groups, from local files and from S3.

Commits segments of realistic scored groups (8 agent trajectories per group, each with thousands
of generated tokens, policy versions and top-p kept-sets) to a local directory and to an S3
server on loopback (moto), then measures, in the same run and against the same objects:

* baseline: list the segments and read every object's verified bytes, no decoding, with the same
  number of threads as the buffer;
* buffer: ``Buffer.poll()`` ingesting them all: read, zstd-decompress, msgspec-decode, index.

Prints groups/s, tokens/s and the ratio of ingest time to the baseline time; the difference is
what decoding costs on top of moving the bytes.

    python benchmarks/buffer.py            # full run (about a minute)
    python benchmarks/buffer.py --quick    # a smoke run for CI: small data, same checks

Machines here are noisy: compare the ratios, not the absolute times. moto's S3 server is a Python
process on the same cores, so S3 numbers say more about moto than about S3.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import platform
import tempfile

import msgspec
from results import command_line, write_results
from results import commit as source_revision
from timing import best_time  # benchmarks/timing.py (this script's folder is on sys.path)

from relayrl.buffer import Buffer, BufferSection, SegmentWriter
from relayrl.buffer.testing import make_trajectory
from relayrl.core import wire
from relayrl.core.store import Store, open_store

THREADS = 4


def make_groups(count: int, *, samples: int, tokens: int, distinct: int = 32) -> list[wire.Group]:
    """``count`` groups; trajectories cycle through ``distinct`` generated ones (building each is slow).

    With ``distinct`` >= groups per segment x samples, no segment holds a trajectory twice, so zstd
    cannot shrink a segment by deduplication that real rollouts would not allow.
    """
    pool = [make_trajectory(task_id="task", group_id="pool", sample_index=i, reward=float(i % 2), versions=100,
                            generated_tokens=tokens, context_tokens=tokens // 4, turns=8) for i in range(distinct)]
    groups = []
    for index in range(count):
        group_id = f"group-{index}"
        trajectories = [msgspec.structs.replace(pool[(index * samples + k) % distinct], group_id=group_id, sample_index=k,
                                                trajectory_id=f"{group_id}/{k}", task_id=f"task-{index % 50}")
                        for k in range(samples)]
        groups.append(wire.Group(group_id=group_id, task_id=f"task-{index % 50}", trajectories=trajectories))
    return groups


def commit(store: Store, groups: list[wire.Group], per_segment: int) -> int:
    writer = SegmentWriter(store, "rollout-0", groups_per_segment=per_segment)
    for group in groups:
        writer.add(group)
    writer.flush()
    return sum(store.stat(key).size for key in writer.committed)


def read_raw(store: Store) -> int:
    keys = store.list("rollouts/")
    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        return sum(len(view) for view in pool.map(store.get_buffer, keys))


def ingest(store: Store) -> tuple[int, int]:
    with Buffer(store, BufferSection(ingest_threads=THREADS, batch_groups=1)) as buffer:
        groups = buffer.poll()
        tokens = buffer.pending_tokens
    return groups, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small data, one repeat (a CI smoke run)")
    args = parser.parse_args()
    groups_total, samples, tokens, per_segment, repeats = (8, 4, 256, 2, 1) if args.quick else (96, 8, 4096, 4, 3)

    revision = source_revision()
    groups = make_groups(groups_total, samples=samples, tokens=tokens)
    setup = (f"{groups_total} groups x {samples} trajectories x {tokens} generated tokens (8 turns, kept-sets), "
             f"{per_segment} groups per segment; {THREADS} threads; best of {repeats}; "
             f"python {platform.python_version()} on {platform.machine()}")
    print(setup)
    rows = []
    with tempfile.TemporaryDirectory(prefix="relayrl-buffer-bench-") as temp:
        backends = [("local files", lambda: open_store(f"file://{temp}/bus"), None)]
        try:
            from relayrl.core.testing import S3Server

            server = S3Server().start()
            server.create_bucket("bench")
            backends.append(("S3 (moto, loopback)", lambda: open_store("s3://bench/run"), server))
        except (ImportError, RuntimeError) as exc:
            server = None
            print(f"S3 rows skipped: no S3 server ({exc}); install relayrl-core[testing]")
        try:
            for name, opener, s3 in backends:
                with s3.environment() if s3 else _null():
                    store = opener()
                    stored = commit(store, groups, per_segment)
                    raw_s, raw_bytes = best_time(lambda store=store: read_raw(store), repeats)
                    ingest_s, (count, token_count) = best_time(lambda store=store: ingest(store), repeats)
                    assert raw_bytes == stored, f"{name}: read {raw_bytes} bytes, committed {stored}"
                    assert count == groups_total, f"{name}: ingested {count} of {groups_total} groups"
                    rows.append((name, stored, raw_s, ingest_s, count, token_count))
        finally:
            if server is not None:
                server.stop()

    lines = [setup + ":", "", "| store | MB stored | read s | ingest s | groups/s | Mtokens/s | ingest / read |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, stored, raw_s, ingest_s, count, token_count in rows:
        lines.append(f"| {name} | {stored / 1e6:.1f} | {raw_s:.3f} | {ingest_s:.3f} | {count / ingest_s:.0f} | "
                     f"{token_count / ingest_s / 1e6:.1f} | {ingest_s / raw_s:.1f}x |")
    lines += ["", "read: list + verified get of every segment, no decoding; ingest: `Buffer.poll()` (read, zstd, msgspec, "
              "index); tokens: the context + generated tokens the trainer processes."]
    markdown = "\n".join(lines)
    print(markdown)
    if not args.quick:
        path = write_results("buffer", command=command_line(), markdown=markdown, revision=revision,
                             data={"rows": [dict(zip(("store", "bytes", "read_s", "ingest_s", "groups", "tokens"), row))
                                            for row in rows]})
        print(f"wrote {path}")


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
