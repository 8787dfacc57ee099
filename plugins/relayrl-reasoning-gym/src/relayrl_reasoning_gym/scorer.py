"""The scorer that runs inside the grading sandbox (stdlib and reasoning_gym only; never imported on the host).

Run as ``python -s -c SOURCE`` with ``PYTHONHASHSEED=0`` and a job on stdin::

    {"format": "tag", "tag": "answer", "timeout_s": 5.0,
     "items": [{"source": {"name": "chain_sum", "config": {...}, "size": 10000, "seed": 0}, "index": 17,
                "text": "<the model's final message>"}, ...]}

and prints one result per item, as JSON: ``[{"reward": 1.0, "answered": true, "flag": ""}, ...]``.
``python -s -c SOURCE generate`` instead prints the entries of the source on stdin: how the host
makes its tasks, in a process of its own with the same hash seed.

**Why a fixed hash seed.** Some datasets build their entries from sets of strings (word_ladder,
isomorphic_strings, knight_swap, ransom_note, polynomial_multiplication in 0.1.25), whose order
follows Python's per-process string hashing: the same seed gave other entries in another process.
Every process that makes or regenerates entries runs with ``PYTHONHASHSEED=0``, so the host's tasks,
a later ``relayrl eval``'s and the scorer's are the same entries.

**What is trusted.** The dataset entry an answer is scored against is *regenerated here* from its
source (dataset name, config, size, seed) and index, never taken from the host's message, and the
score is the dataset's own ``score_answer`` on the text between the last pair of answer tags.

**Isolation between answers.** Some datasets' ``score_answer`` evaluate the answer's text (sympy's
``parse_expr`` calls ``eval``), so an answer may run code here. Each answer is therefore scored in
a forked child, one after the other, whose standard streams point at /dev/null and which reports
through a pipe of its own as ``KEY SCORE``, the key a fresh random one held only in the scoring
frame: code that one answer runs cannot touch another answer's result, and an audit hook ends the
child at once (flag ``scorer-escape``) on what no scorer needs: frame and garbage-collector
introspection (the way to the key), processes, signals, sockets, ctypes, file writes. A child
that dies, hangs past ``timeout_s`` or reports without the key earns 0 and a flag. What an
evaluated answer can still do inside its own child (return an object that compares equal to
anything) is why the host also flags answers that are code (``relayrl_reasoning_gym.detectors``),
and the sandbox around the whole command (no network, read-only host, a uid of its own) bounds
the rest.
"""

import contextlib
import json
import math
import os
import re
import select
import signal
import sys
import time

FORBIDDEN_EVENTS = (
    "sys._getframe", "sys._current_frames", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill", "os.killpg",
    "subprocess.Popen", "socket.", "ctypes.", "os.remove", "os.rename", "os.rmdir", "os.chmod", "os.chown",
    "os.truncate", "os.symlink", "os.link", "pty.spawn", "sys.settrace", "sys.setprofile", "signal.pthread_kill",
    "code.__new__", "function.__new__", "builtins.input",
)
"""Audit events whose prefix ends a scoring child: a scorer parses and compares text, nothing more."""

RESTRICTED_ATTRIBUTES = ("tb_frame", "f_back", "f_globals", "f_locals", "gi_frame", "cr_frame", "ag_frame",
                         "f_builtins", "__globals__")
"""``object.__getattr__`` audit events for these attributes (frame walking) end the child too."""


LAST_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")


def extract_answer(text, answer_format, tag="answer"):
    """The answer in ``text`` under ``answer_format``, stripped; None when there is none.

    ``tag``: between the last ``<tag>`` ... ``</tag>`` pair; ``whole``: the whole text; ``last-line``:
    its last non-empty line; ``last-number``: its last number (``-12``, ``3.5``, ``1,000``), the
    "flexible" extraction of numeric answers that lm-eval's GSM8K task uses.
    """
    if answer_format == "tag":
        matches = re.findall(f"<{tag}>(.*?)</{tag}>", text, flags=re.DOTALL)
        answer = matches[-1] if matches else ""
    elif answer_format == "whole":
        answer = text
    elif answer_format == "last-line":
        lines = [line for line in text.splitlines() if line.strip()]
        answer = lines[-1] if lines else ""
    elif answer_format == "last-number":
        numbers = LAST_NUMBER.findall(text)
        answer = numbers[-1] if numbers else ""
    else:
        raise ValueError(f"unknown answer format {answer_format!r}")
    return answer.strip() or None


def _dataset(source, cache):
    key = json.dumps(source, sort_keys=True)
    if key not in cache:
        import reasoning_gym

        config = dict(source.get("config") or {})
        if source["name"] == "composite":
            from reasoning_gym.composite import DatasetSpec

            config["datasets"] = [DatasetSpec(name=spec["name"], weight=spec["weight"], config=dict(spec["config"]))
                                  for spec in source["datasets"]]
        cache[key] = reasoning_gym.create_dataset(source["name"], size=source["size"], seed=source["seed"], **config)
    return cache[key]


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _audit(event, args):
    if event == "open" and (
            (len(args) > 1 and isinstance(args[1], str) and any(mode in args[1] for mode in "wax+"))
            or (len(args) > 2 and isinstance(args[2], int) and args[2] & _WRITE_FLAGS)):  # open() and os.open()
        os._exit(87)
    if event == "object.__getattr__" and len(args) > 1 and args[1] in RESTRICTED_ATTRIBUTES:
        os._exit(87)
    if event.startswith(FORBIDDEN_EVENTS):
        os._exit(87)


def _child(write_fd, key, dataset, entry, answer):
    """Score one answer and report ``key score`` on ``write_fd``; never returns."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    report = os.fdopen(write_fd, "w")  # opened before the hook: the hook refuses opens for writing
    sys.addaudithook(_audit)
    try:
        score = float(dataset.score_answer(answer, entry))
    except BaseException:  # the dataset's scorer failed on this text: no credit
        score = 0.0
    report.write(f"{key} {score!r}")
    report.flush()
    os._exit(0)


def _score(dataset, entry, answer, timeout_s):
    """(reward, flag) of one answer, scored in a forked child."""
    read_fd, write_fd = os.pipe()
    key = os.urandom(16).hex()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(write_fd, key, dataset, entry, answer)
    os.close(write_fd)
    data, deadline = b"", time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([read_fd], [], [], remaining)[0]:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(read_fd)
            return 0.0, "scorer-timeout"
        chunk = os.read(read_fd, 4096)
        if not chunk:
            break
        data += chunk
        if len(data) > 4096:
            break
    os.close(read_fd)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)  # whatever it left running
    _, status = os.waitpid(pid, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 87:
        return 0.0, "scorer-escape"
    parts = data.decode("utf-8", "replace").split()
    if len(parts) != 2 or parts[0] != key:
        return 0.0, "scorer-report-forged"
    try:
        reward = float(parts[1])
    except ValueError:
        return 0.0, "scorer-report-forged"
    return (min(1.0, max(0.0, reward)) if math.isfinite(reward) else 0.0), ""


def generate():
    """Entries of one source (``{"name", "config", "size", "seed"[, "datasets"]}`` on stdin) as JSON."""
    source = json.load(sys.stdin)
    verdict = os.fdopen(os.dup(1), "w")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # what datasets print while building is not the output
    dataset = _dataset(source, {})
    entries = []
    for index in range(source["size"]):
        entry = dataset[index]
        metadata = entry.get("metadata") or {}
        entries.append({"question": entry["question"],
                        "answer": None if entry.get("answer") is None else str(entry["answer"]),
                        "category": str(metadata.get("source_dataset", source["name"])),
                        "difficulty": json.loads(json.dumps(metadata.get("difficulty", {}), default=str))})
    verdict.write(json.dumps(entries))
    verdict.flush()


def main():
    if sys.argv[1:] == ["generate"]:
        generate()
        return
    job = json.load(sys.stdin)
    # What datasets print while they are built or score (some do) must not reach the verdict: the
    # results go to a private copy of stdout, and fd 1 points at /dev/null for everything else.
    verdict = os.fdopen(os.dup(1), "w")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    sys.stdout = os.fdopen(os.dup(devnull), "w")
    cache, results = {}, []
    for item in job["items"]:
        dataset = _dataset(item["source"], cache)
        entry = dataset[item["index"]]
        answer = extract_answer(item["text"], job["format"], job["tag"])
        if answer is None:
            results.append({"reward": 0.0, "answered": False, "flag": ""})
            continue
        reward, flag = _score(dataset, entry, answer, float(job["timeout_s"]))
        results.append({"reward": reward, "answered": True, "flag": flag})
    verdict.write(json.dumps(results))
    verdict.flush()


if __name__ == "__main__":
    main()
