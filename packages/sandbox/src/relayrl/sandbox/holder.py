"""A sandbox's persistent namespaces, kept alive by a holder process (no namespace files are mounted).

The ``process`` backend builds a sandbox's mount, IPC and network namespaces once and lets every
command enter them (``nsenter --target PID``). They used to be kept in bind-mounted namespace files;
on recent kernels (6.18) the check that forbids mount-namespace loops compares namespace ids that
are no longer ordered, and that bind mount failed with EINVAL in about half the calls inside
containers. A process that sits in the namespaces keeps them just as well, with nothing mounted.

The holder is this module's source run as root, under ``unshare --mount --ipc [--net]``, by an
interpreter without ``site`` (it needs only the standard library, and starts in milliseconds)::

    python3 -I -S -c SOURCE SPEC_JSON

It builds the sandbox's root from nothing (:mod:`relayrl.sandbox.view`): a small tmpfs in which the
visible host paths are bind-mounted (the same symlinks where the host has symlinks, such as
``/bin -> usr/bin``), the host's ``/dev`` and ``/proc`` (each command mounts a ``/proc`` of its own
PID namespace over it), the workspace, private tmpfs directories and the masks; it pivots into that
root, detaches the host's, makes every mount but the workspace and the private directories
read-only (a mount that refuses is covered by an empty read-only tmpfs instead), prints ``ready``
and sleeps until it is killed. Commands enter with ``nsenter --root``, so they start in that root.
Its PID stays reserved for the sandbox's life: the backend never reaps it before ``release``, so
the PID cannot be reused by another process while commands still enter it.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import sys

__all__ = ["host_unix_sockets", "main", "mount_points"]


def _unescape(field: str) -> str:
    """A mountinfo field with its octal escapes (``\\040`` for a space) decoded."""
    out, index = [], 0
    while index < len(field):
        if field[index] == "\\" and field[index + 1:index + 4].isdigit():
            out.append(chr(int(field[index + 1:index + 4], 8)))
            index += 4
        else:
            out.append(field[index])
            index += 1
    return "".join(out)


def mount_points(mountinfo: str = "/proc/self/mountinfo") -> list[tuple[str, str]]:
    """``(mount point, options)`` of every mount, outermost first."""
    with open(mountinfo) as handle:
        rows = [line.split() for line in handle]
    return [(_unescape(row[4]), row[5]) for row in rows]


def host_unix_sockets(table: str = "/proc/net/unix") -> list[str]:
    """Paths of the unix sockets bound in this network namespace (abstract ones excluded)."""
    try:
        with open(table) as handle:
            lines = handle.read().splitlines()[1:]
    except OSError:
        return []
    paths = set()
    for line in lines:
        fields = line.split(None, 7)
        if len(fields) == 8 and fields[7].startswith("/"):
            paths.add(fields[7])
    return sorted(paths)


MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC = 1, 2, 4, 8, 32, 4096, 8192, 16384
MNT_DETACH = 2
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217, "riscv64": 41}
"""pivot_root(2)'s syscall number (glibc has no wrapper); elsewhere the root is moved and chrooted."""
_KEPT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": 1024, "nodiratime": 2048,
               "relatime": 1 << 21, "strictatime": 1 << 24}
_libc = ctypes.CDLL(None, use_errno=True)  # mount(2) directly: one call per mount, not one process


def _bytes(value: str | None) -> bytes | None:
    return None if value is None else value.encode()


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    """mount(2); raises OSError naming the target."""
    if _libc.mount(_bytes(source), _bytes(target), _bytes(fstype), ctypes.c_ulong(flags), _bytes(data)) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"mount {target}: {os.strerror(error)}")


def _make_read_only(keep_writable: list[str]) -> list[str]:
    """Remount every mount read-only but those at or below ``keep_writable``; return what had to be covered.

    The flags a mount already has (``nosuid``, ``noexec`` ...) are kept: a bind remount sets them all.
    """
    covered = []
    for point, options in mount_points():
        if any(point == path or point.startswith(path + "/") for path in keep_writable):
            continue
        kept = sum(flag for name, flag in _KEPT_FLAGS.items() if name in options.split(","))
        try:
            try:
                _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)
            except OSError:
                if point == "/" or not os.path.isdir(point):
                    raise
                # A mount that refuses to be read-only (locked, or a type that cannot) is hidden instead.
                _mount("tmpfs", point, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=0555")
                covered.append(point)
        except OSError as error:
            if error.errno == errno.ENOENT and point != "/" and not os.path.lexists(point):
                # Another sandbox's workspace, unmounted and removed on the host after this namespace
                # copied the host's mounts: its copy here is detached, no path reaches it.
                continue
            if point != "/" and not any(listed == point for listed, _ in mount_points()):
                # The same race a moment earlier: the mount was detached after the listing, so its
                # path is a plain directory now (EINVAL) and nothing is mounted there to make read-only.
                continue
            raise
    return covered


def _expose(path: str, root: str) -> None:
    """Make host ``path`` appear at the same place under ``root``: a symlink as the same symlink,
    anything else bind-mounted (recursively: what is mounted below it comes along)."""
    target = root + path
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if os.path.islink(path):
        os.symlink(os.readlink(path), target)
        return
    if os.path.isdir(path):
        os.makedirs(target, exist_ok=True)
    else:
        open(target, "a").close()  # a file's mount point
    _mount(path, target, None, MS_BIND | MS_REC)


def _enter(root: str) -> None:
    """Make ``root`` this mount namespace's root and detach the host's (nothing outside stays reachable)."""
    os.chdir(root)
    number = _PIVOT_ROOT.get(platform.machine())
    if number is not None and _libc.syscall(ctypes.c_long(number), b".", b".") == 0:
        # pivot_root(".", "."): the old root now sits on top of the new one; detaching it leaves the new.
        if _libc.umount2(b".", MNT_DETACH) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"detaching the host's root: {os.strerror(error)}")
    else:
        _mount(root, "/", None, MS_MOVE)
        os.chroot(".")
    os.chdir("/")


def main(spec: dict) -> None:
    """Set up the namespaces this process is in (see the module docstring), then hold them."""
    # Found before the pivot: afterwards this interpreter's own standard library may be out of sight
    # (nothing may be imported from here on).
    sleep = next((os.path.join(directory, "sleep") for directory in ("/usr/bin", "/bin")
                  if os.path.exists(os.path.join(directory, "sleep"))), "/bin/sleep")
    try:
        root = spec["new_root"]
        _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        for path in [*spec["visible"], "/dev", "/proc"]:
            _expose(path, root)
        for path in spec["covered"]:  # e.g. the sandboxes' root inside an exposed directory
            _mount("tmpfs", root + path, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755")
        for path in spec["keep_writable"]:  # the workspace, at the same path as on the host
            os.makedirs(root + path, exist_ok=True)
            _mount(path, root + path, None, MS_BIND)
        for path in spec["private"]:
            os.makedirs(root + path, exist_ok=True)
            _mount("tmpfs", root + path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={spec['tmp_size']},mode=1777")
        for path in spec["hidden_directories"]:
            if os.path.isdir(root + path) and not os.path.islink(root + path):
                _mount("tmpfs", root + path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=0555")
        for path in spec["hidden_files"]:
            if os.path.lexists(root + path) and not os.path.isdir(root + path):
                _mount("/dev/null", root + path, None, MS_BIND)
        _enter(root)
        _make_read_only([*spec["keep_writable"], *spec["private"]])
    except OSError as error:  # a secret that cannot be hidden, a host that stays writable: no sandbox
        raise SystemExit(str(error)) from None
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    os.execv(sleep, ["sleep", "infinity"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
