"""relayrl's split grading runner: the hidden tests in a trusted driver, the answer's code in a worker.

A standalone script (standard library only, Python >= 3.10). The grader copies it into the grading
sandbox (root-owned, read-only for the answer) and runs the **driver**::

    python3 -I -B split_runner.py         # payload on stdin:
    {"key": HEX, "root": DIR, "modules": {"tests/test_x.py": SOURCE, ...},
     "inventory": ["tests.test_x.TestX.test_a", ...], "python": "python3", "test_timeout_s": 30}

Before any answer code exists, the driver reads the payload, makes itself non-dumpable (``prctl``:
no process of the sandbox may ptrace it or read its memory or descriptors) and starts the
**worker**, ``python3 -I -B split_runner.py worker DIR``, the only process that imports the
answer's code. The hidden tests run in the driver, under the real ``unittest``; every module of
the workspace they import is a proxy, and every use of it (an attribute, a call, iteration, an
operator) is a request to the worker over a pipe, answered with **plain data** only: ``None``,
``bool``, ``int``, ``float``, ``complex``, ``str``, ``bytes``, ``bytearray`` and tuples, lists,
dicts, sets and frozensets of them, decoded by the driver into its own builtin objects, or with a
**handle** to an object that stays in the worker. Nothing with behaviour crosses back:

* the expected values, the test code, the key and the verdict exist only in the driver;
* comparisons happen in the driver, between the driver's own builtin objects: an object of the
  answer that equals everything (whatever its metaclass says about ``__flags__`` or ``__mro__``)
  stays a handle, and a handle refuses ``==``, ordering, truth and ``hash`` (the test fails as
  unverifiable); tests compare plain data (``p.x``, ``list(stack)``, ``str(obj)``);
* the worker holds no frame, closure or code object of the driver: there is nothing to walk,
  patch or read, and whatever it writes on the pipe is only data.

It reports like :mod:`relayrl.sandbox.grading_runner` (the host verifies both the same way): one
``RELAYRL-EVIDENCE <seq> <hmac> <repr of a tuple of strings>`` line per record on the driver's
original stdout, which the worker never holds.
"""

import base64
import json
import math
import os
import select
import time

RECORD_PREFIX = "RELAYRL-EVIDENCE"
PROTOCOL = "1"
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MAX_DEPTH = 100


# ---------------------------------------------------------------------------------------- wire
# Plain data as JSON: lists are lists, everything else is a one-key object naming its type.

def wire_codec():
    """``(encode, decode)`` of plain data (the probes on the host speak it too)."""

    def encode(value, handle_of, depth=0):
        """``value`` as JSON-able data; what is not plain data becomes ``handle_of(value)``."""
        if depth > MAX_DEPTH:
            raise ValueError("data nested too deeply")
        kind = type(value)
        if value is None or kind is bool or kind is str:
            return value
        if kind is int:
            return value if -(2 ** 53) < value < 2 ** 53 else {"i": str(value)}
        if kind is float:
            return value if math.isfinite(value) else {"f": repr(value)}
        if kind is complex:
            return {"c": [encode(value.real, handle_of), encode(value.imag, handle_of)]}
        if kind is bytes:
            return {"b": base64.b64encode(value).decode()}
        if kind is bytearray:
            return {"ba": base64.b64encode(value).decode()}
        if kind is list:
            return [encode(item, handle_of, depth + 1) for item in value]
        if kind is tuple:
            return {"t": [encode(item, handle_of, depth + 1) for item in value]}
        if kind is set or kind is frozenset:
            return {"s" if kind is set else "fs": [encode(item, handle_of, depth + 1) for item in value]}
        if kind is dict:
            return {"d": [[encode(key, handle_of, depth + 1), encode(item, handle_of, depth + 1)]
                          for key, item in value.items()]}
        return handle_of(value)

    def decode(data, from_handle, depth=0):
        """The value ``data`` encodes, built from builtin types only (handles via ``from_handle``)."""
        if depth > MAX_DEPTH:
            raise ValueError("data nested too deeply")
        kind = type(data)
        if data is None or kind is bool or kind is str or kind is int or kind is float:
            return data
        if kind is list:
            return [decode(item, from_handle, depth + 1) for item in data]
        if kind is not dict or len(data) != 1:
            raise ValueError(f"not a value: {str(data)[:80]}")
        (tag, body), = data.items()
        if tag == "i" and type(body) is str:
            return int(body)
        if tag == "f" and body in ("nan", "inf", "-inf"):
            return float(body)
        if tag == "c" and type(body) is list and len(body) == 2:
            parts = [decode(part, from_handle, depth + 1) for part in body]
            if all(type(part) in (int, float) for part in parts):
                return complex(*parts)
        if tag in ("b", "ba") and type(body) is str:
            raw = base64.b64decode(body, validate=True)
            return raw if tag == "b" else bytearray(raw)
        if tag in ("t", "s", "fs") and type(body) is list:
            items = [decode(item, from_handle, depth + 1) for item in body]
            return tuple(items) if tag == "t" else set(items) if tag == "s" else frozenset(items)
        if tag == "d" and type(body) is list:
            out = {}
            for pair in body:
                if type(pair) is not list or len(pair) != 2:
                    raise ValueError("a dict item is not a pair")
                out[decode(pair[0], from_handle, depth + 1)] = decode(pair[1], from_handle, depth + 1)
            return out
        if tag in ("h", "cb", "bi"):
            return from_handle(tag, body)
        raise ValueError(f"not a value: {str(data)[:80]}")

    return encode, decode


class _Channel:
    """JSON lines over two descriptors, each line at most :data:`MAX_MESSAGE_BYTES`."""

    def __init__(self, read_fd, write_fd):
        self.read_fd, self.write_fd, self.buffer = read_fd, write_fd, b""

    def send(self, message):
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        while data:
            data = data[os.write(self.write_fd, data):]

    def receive(self, deadline=None):
        """The next message; TimeoutError past ``deadline`` (time.monotonic), EOFError when closed."""
        while b"\n" not in self.buffer:
            if len(self.buffer) > MAX_MESSAGE_BYTES:
                raise ValueError("a message larger than the limit")
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.read_fd], [], [], left)[0]:
                    raise TimeoutError
            chunk = os.read(self.read_fd, 1 << 20)
            if not chunk:
                raise EOFError
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        message = json.loads(line)
        if type(message) is not dict:
            raise ValueError("a message is not an object")
        return message


# ---------------------------------------------------------------------------------------- worker
def worker(root):
    """Serve the driver's requests on the answer's code (this process is the answer's to do with)."""
    import builtins
    import importlib
    import operator
    import sys

    channel = _Channel(os.dup(0), os.dup(1))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the answer's input() and prints never touch the channel
    os.dup2(2, 1)
    os.close(null)
    # After the standard library (an answer's json.py must not shadow it), before site-packages.
    site = [index for index, entry in enumerate(sys.path) if "-packages" in entry]
    sys.path.insert(site[0] if site else len(sys.path), root)
    os.chdir(root)
    encode, decode = wire_codec()
    objects, ids = {}, {}
    counter = [0]
    callbacks = {}

    def kind_of(value):
        if isinstance(value, type(sys)):
            return "module"
        if isinstance(value, type) and issubclass(value, BaseException):
            return "exception-class"
        if isinstance(value, type):
            return "class"
        if hasattr(type(value), "__next__"):
            return "iterator"
        return "callable" if callable(value) else "object"

    def handle_of(value):
        key = id(value)
        if key not in ids:
            counter[0] += 1
            ids[key], objects[counter[0]] = counter[0], value
        number = ids[key]
        name = getattr(value, "__qualname__", None)
        body = {"id": number, "kind": kind_of(value),
                "name": (name if isinstance(name, str) else type(value).__qualname__)[:200]}
        if body["kind"] == "exception-class":
            body["bases"] = [out(base) for base in value.__bases__]
            body["builtin"] = value.__module__ == "builtins" and getattr(builtins, value.__name__, None) is value
        return {"h": body}

    def out(value):
        return encode(value, handle_of)

    def from_handle(tag, body):
        if tag == "h":
            return objects[int(body)]
        if tag == "bi":
            return getattr(builtins, str(body))
        if body not in callbacks:
            def callback(*args, **kwargs):
                return request({"op": "callback", "cb": body, "args": out(list(args)),
                                "kwargs": out(dict(kwargs))})
            callbacks[body] = callback
        return callbacks[body]

    def value(data):
        return decode(data, from_handle)

    def error_of(error):
        try:
            args = out(list(error.args))
        except Exception:  # arguments that cannot cross: their text does
            args = out([str(error)[:1000]])
        return {"class": out(type(error)), "args": args, "text": str(error)[:2000]}

    pending = [0]

    def request(message):
        """A callback to the driver (a function of the tests the answer calls); serves nested requests."""
        pending[0] += 1
        number = -pending[0]
        channel.send({**message, "id": number})
        return serve(until=number)

    binary = {name: getattr(operator, name) for name in (
        "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "lshift", "rshift", "and_", "or_", "xor")}
    unary = {"neg": operator.neg, "pos": operator.pos, "abs": abs, "invert": operator.invert}

    def perform(message):
        op = message.get("op")
        target = objects[int(message["target"])] if "target" in message else None
        if op == "import":
            return importlib.import_module(str(message["name"]))
        if op == "getattr":
            return getattr(target, str(message["name"]))
        if op == "setattr":
            return setattr(target, str(message["name"]), value(message["value"]))
        if op == "delattr":
            return delattr(target, str(message["name"]))
        if op == "call":
            args, kwargs = value(message["args"]), value(message["kwargs"])
            result = target(*args, **kwargs)
            # Lists, dicts, sets and bytearrays the call may have changed in place go back too.
            mutable = [[index, out(arg)] for index, arg in enumerate(args) if type(arg) in (list, dict, set, bytearray)]
            return result, mutable
        if op == "getitem":
            return target[value(message["key"])]
        if op == "setitem":
            target[value(message["key"])] = value(message["value"])
            return None
        if op == "delitem":
            del target[value(message["key"])]
            return None
        if op in ("len", "iter", "next", "str", "repr", "hash", "int", "float", "index", "complex"):
            function = {"len": len, "iter": iter, "next": next, "str": str, "repr": repr, "hash": hash, "int": int,
                        "float": float, "index": operator.index, "complex": complex}[op]
            return function(target)
        if op == "format":
            return format(target, str(message["spec"]))
        if op == "contains":
            return value(message["item"]) in target
        if op == "compare":  # two objects of the answer: its own equality and ordering
            return getattr(operator, str(message["name"]))(target, value(message["other"]))
        if op == "binary":
            other = value(message["other"])
            function = binary[str(message["name"])]
            return function(other, target) if message.get("reflected") else function(target, other)
        if op == "unary":
            return unary[str(message["name"])](target)
        if op == "isinstance":
            return isinstance(value(message["value"]), target)
        if op == "issubclass":
            return issubclass(value(message["value"]), target)
        if op == "enter":
            return target.__enter__()
        if op == "exit":
            failure = message.get("error")
            if failure is None:
                return target.__exit__(None, None, None)
            error = getattr(builtins, str(failure), RuntimeError)("raised in the tests")
            return target.__exit__(type(error), error, None)
        raise ValueError(f"unknown request {op!r}")

    def serve(until=None):
        while True:
            message = channel.receive()
            number = message.get("id")
            if "op" not in message:  # the answer to a callback of ours
                if number != until:
                    raise ValueError("an answer to a request that was not made")
                if "raise" in message:
                    raise getattr(builtins, str(message["raise"]), RuntimeError)(str(message.get("text", "")))
                return value(message["ok"])
            try:
                result = perform(message)
                mutable = []
                if message["op"] == "call":
                    result, mutable = result
                reply = {"id": number, "ok": out(result)}
                if mutable:
                    reply["mutated"] = mutable
            except BaseException as error:  # every failure of the answer's code is the driver's to see
                try:
                    reply = {"id": number, "raise": error_of(error)}
                except BaseException:  # an error that cannot even be described: the driver makes it a RuntimeError
                    reply = {"id": number, "raise": {"class": None, "args": [], "text": "an undescribable error"}}
            channel.send(reply)

    serve()


# ---------------------------------------------------------------------------------------- driver
def driver():
    import _hashlib
    import builtins
    import contextlib
    import ctypes
    import importlib.abc
    import importlib.machinery
    import subprocess
    import sys
    import types
    import unittest

    chunks = []
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    payload = json.loads(b"".join(chunks))
    key = bytes.fromhex(payload["key"])
    root = payload["root"]
    inventory = list(payload["inventory"])
    test_timeout_s = float(payload.get("test_timeout_s", 30))
    record_fd = os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)  # the tests' own prints go to stderr; the record stream is ours alone
    os.close(null)

    # Reading the payload and signing records as grading_runner.main does: both are scripts copied
    # alone into a sandbox, so they cannot share code; evidence.verify_records is their one reader.
    sequence = [0]

    def emit(*fields):
        body = repr(tuple(field if type(field) is str else "<not a string>" for field in fields))
        seq = str(sequence[0])
        sequence[0] += 1
        mac = _hashlib.hmac_digest(key, (seq + "|" + body).encode(), "sha256").hex()
        data = (RECORD_PREFIX + " " + seq + " " + mac + " " + body + "\n").encode()
        while data:
            data = data[os.write(record_fd, data):]

    # Non-dumpable before the worker exists: no process of the sandbox (the answer's uid) can ptrace
    # this one, read /proc/PID/mem or reach its descriptors (the record stream among them).
    protections = []
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) == 0 and libc.prctl(3, 0, 0, 0, 0) == 0:  # PR_SET_DUMPABLE, PR_GET_DUMPABLE
        protections.append("non-dumpable")
    protections.append("split")

    encode, decode = wire_codec()

    class Unverifiable(TypeError):
        """An object of the answer met a comparison, a truth test or a hash in the trusted process."""

    class WorkerLost(RuntimeError):
        """The answer's process died, hung past the test's time, or broke the protocol."""

    state = {"deadline": None, "alive": False, "number": 0, "process": None, "channel": None}
    proxies, classes, callbacks, callback_ids = {}, {}, {}, {}
    paths = {}  # handle -> "module.function" of the workspace's module-level functions the tests used
    calls = []  # (path, args, kwargs) the tests made with plain data and got plain data back (mode "record")
    mode = payload.get("mode", "grade")

    def start_worker():
        """A fresh worker (a fresh import of the answer); what the previous one handed out is dropped."""
        stop_worker()
        proxies.clear()
        classes.clear()
        paths.clear()
        for name in [name for name, module in sys.modules.items() if isinstance(module, AnswerModule)]:
            del sys.modules[name]
        process = subprocess.Popen([payload.get("python", "python3"), "-I", "-B", __file__, "worker", root],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=root, close_fds=True)
        state.update(process=process, channel=_Channel(process.stdout.fileno(), process.stdin.fileno()), alive=True)

    def stop_worker():
        if state["process"] is not None and state["alive"]:
            state["process"].kill()
        state["alive"] = False

    def lose(reason):
        stop_worker()
        raise WorkerLost(reason)

    def handle_of(value):  # what the tests hand to the answer
        if isinstance(value, Proxy):
            return {"h": object.__getattribute__(value, "_rid")}
        if isinstance(value, type) and "_relayrl_rid" in value.__dict__:  # a class standing for the answer's
            return {"h": value.__dict__["_relayrl_rid"]}
        name = getattr(value, "__name__", None)
        if isinstance(value, (type, types.BuiltinFunctionType)) and isinstance(name, str) \
                and getattr(builtins, name, None) is value:
            return {"bi": name}  # int, len, ValueError ...: the worker's own
        if callable(value):  # a function of the tests: the answer calls it back here
            if id(value) not in callback_ids:
                callback_ids[id(value)] = len(callbacks) + 1
                callbacks[len(callbacks) + 1] = value
            return {"cb": callback_ids[id(value)]}
        raise TypeError(f"a {type(value).__name__} cannot be handed to the answer's process (plain data, the "
                        f"answer's own objects and functions only)")

    def out(value):
        return encode(value, handle_of)

    def plain(data):
        """Whether encoded ``data`` holds no handle, callback or builtin reference (plain data only)."""
        if type(data) is list:
            return all(plain(item) for item in data)
        if type(data) is dict:
            (tag, body), = data.items()
            return tag not in ("h", "cb", "bi") and plain(body)
        return True

    def from_handle(tag, body):  # what the answer hands back
        if tag != "h" or type(body) is not dict or type(body.get("id")) is not int:
            raise ValueError("a malformed handle")
        number = body["id"]
        if body.get("kind") == "exception-class":
            return exception_class(body)
        if number not in proxies:
            proxies[number] = Proxy(number, str(body.get("kind")), str(body.get("name"))[:200])
        return proxies[number]

    def exception_class(body):
        """A real exception class in this process standing for the answer's (``assertRaises`` takes it)."""
        number = body["id"]
        if number in classes:
            return classes[number]
        if body.get("builtin") is True:
            found = getattr(builtins, str(body.get("name")), None)
            if isinstance(found, type) and issubclass(found, BaseException):
                classes[number] = found
                return found
        bases = []
        for base in body.get("bases") or []:
            decoded = value(base)
            if isinstance(decoded, type) and issubclass(decoded, BaseException):
                bases.append(decoded)
        bases = tuple(dict.fromkeys(bases)) or (Exception,)
        try:
            made = type(str(body.get("name") or "AnswerError").rsplit(".", 1)[-1], bases,
                        {"_relayrl_rid": number, "__module__": "answer"})
        except TypeError:  # bases that cannot be combined here: the nearest usable one
            made = type("AnswerError", (bases[0],), {"_relayrl_rid": number, "__module__": "answer"})
        classes[number] = made
        return made

    def value(data):
        return decode(data, from_handle)

    def remote_error(failure):
        """The driver's equivalent of an exception the answer's code raised (a builtin or a class made here)."""
        if type(failure) is not dict:
            raise ValueError("a malformed error")
        cls = value(failure.get("class"))
        args = value(failure.get("args", []))
        if not (isinstance(cls, type) and issubclass(cls, BaseException)) or type(args) is not list:
            return RuntimeError(str(failure.get("text", ""))[:2000])
        if not issubclass(cls, Exception):  # SystemExit, KeyboardInterrupt ...: never the driver's to obey
            return RuntimeError(f"the answer raised {cls.__name__}")
        try:
            return cls(*args)
        except Exception:  # a class whose constructor wants other arguments
            error = cls.__new__(cls)
            error.args = tuple(args)
            return error

    def call(op, **fields):
        """One request to the worker and its plain answer; serves the worker's callbacks meanwhile.

        The answer's own exception (a ValueError its code raised, say) is raised here as the driver's
        equivalent; anything wrong with the exchange itself ends the worker (:class:`WorkerLost`)."""
        if not state["alive"]:
            raise WorkerLost("the answer's process is gone")
        state["number"] += 1
        number = state["number"]
        try:
            state["channel"].send({"id": number, "op": op, **fields})
            while True:
                message = state["channel"].receive(state["deadline"])
                if message.get("op") != "callback":
                    break
                answer_callback(message)
            if message.get("id") != number:
                lose("the answer's process answered a request that was not made")
            if "raise" in message:
                error, result = remote_error(message["raise"]), None
            else:
                error, result = None, value(message.get("ok"))
                mutated = message.get("mutated") or []
        except TimeoutError:
            lose("the answer's code did not return within the test's time")
        except (EOFError, OSError, ValueError, KeyError, TypeError, RecursionError, MemoryError) as broken:
            lose(f"the answer's process broke the protocol or died ({type(broken).__name__})")
        if error is not None:
            raise error
        return (result, mutated) if op == "call" else result

    def answer_callback(message):
        number = message.get("id")
        try:
            function = callbacks[message.get("cb")]
            result = function(*value(message.get("args")), **value(message.get("kwargs")))
            reply = {"id": number, "ok": out(result)}
        except (WorkerLost, Unverifiable):
            raise
        except Exception as error:  # the tests' function failed: the answer sees which error
            name = type(error).__name__
            reply = {"id": number, "raise": name if getattr(builtins, name, None) is type(error) else "RuntimeError",
                     "text": str(error)[:500]}
        state["channel"].send(reply)

    def refuse(what):
        def method(self, *args):
            raise Unverifiable(f"{what} of an object of the answer ({self!r}) cannot be trusted; compare plain data "
                               f"(numbers, strings, lists of them) the answer's code returns")
        return method

    def compared(name):
        """``==``, ``<`` ...: between two objects of the answer it is the answer's own semantics, asked
        there (a plain bool comes back); against the tests' data it is refused, because an object of
        the answer could equal anything."""
        def method(self, other):
            if not isinstance(other, Proxy):
                return refuse("comparing")(self)
            return self._typed("compare", bool, name=name, other=out(other))
        return method

    class Proxy:
        """An object that lives in the answer's process; every use is a request there."""

        __slots__ = ("_kind", "_name", "_rid")

        def __init__(self, number, kind, name):
            object.__setattr__(self, "_rid", number)
            object.__setattr__(self, "_kind", kind)
            object.__setattr__(self, "_name", name)

        def _request(self, op, **fields):
            return call(op, target=object.__getattribute__(self, "_rid"), **fields)

        def __getattr__(self, name):
            return self._request("getattr", name=name)

        def __setattr__(self, name, item):
            self._request("setattr", name=name, value=out(item))

        def __delattr__(self, name):
            self._request("delattr", name=name)

        def __call__(self, *args, **kwargs):
            arguments = [out(list(args)), out(dict(kwargs))]
            result, mutated = self._request("call", args=arguments[0], kwargs=arguments[1])
            path = paths.get(object.__getattribute__(self, "_rid"))
            if mode == "record" and path and len(calls) < 200 and plain(arguments) and plain(out(result)):
                calls.append((path, *arguments))
            for index, data in mutated:
                original, new = args[index], value(data)
                if type(original) is type(new) and type(original) in (list, bytearray):
                    original[:] = new
                elif type(original) is type(new) and type(original) in (dict, set):
                    original.clear()
                    original.update(new)
            return result

        def __repr__(self):
            return f"<answer {object.__getattribute__(self, '_kind')} {object.__getattribute__(self, '_name')}>"

        def __str__(self):
            return self._typed("str", str)

        def _typed(self, op, kind, **fields):
            result = self._request(op, **fields)
            if type(result) is not kind:
                raise TypeError(f"{op}() of an object of the answer returned {type(result).__name__}")
            return result

        def __format__(self, spec):
            return self._typed("format", str, spec=spec)

        def __len__(self):
            return self._typed("len", int)

        def __iter__(self):
            return self._request("iter")

        def __next__(self):
            return self._request("next")

        def __getitem__(self, key):
            return self._request("getitem", key=out(key))

        def __setitem__(self, key, item):
            self._request("setitem", key=out(key), value=out(item))

        def __delitem__(self, key):
            self._request("delitem", key=out(key))

        def __contains__(self, item):
            return self._typed("contains", bool, item=out(item))

        def __int__(self):
            return self._typed("int", int)

        def __index__(self):
            return self._typed("index", int)

        def __float__(self):
            return self._typed("float", float)

        def __complex__(self):
            return self._typed("complex", complex)

        def __enter__(self):
            return self._request("enter")

        def __exit__(self, kind, error, traceback):
            result = self._request("exit", error=None if kind is None else kind.__name__)
            return result is True

        def __instancecheck__(self, instance):
            return self._typed("isinstance", bool, value=out(instance))

        def __subclasscheck__(self, subclass):
            return self._typed("issubclass", bool, value=out(subclass))

        __eq__, __ne__ = compared("eq"), compared("ne")
        __lt__, __le__, __gt__, __ge__ = compared("lt"), compared("le"), compared("gt"), compared("ge")
        __bool__ = refuse("the truth")

        def __hash__(self):
            return self._typed("hash", int)

    def operator_methods():
        for name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "lshift", "rshift", "and",
                     "or", "xor"):
            remote = name + "_" if name in ("and", "or") else name

            def forward(self, other, remote=remote):
                return self._request("binary", name=remote, other=out(other))

            def reflected(self, other, remote=remote):
                return self._request("binary", name=remote, other=out(other), reflected=True)

            setattr(Proxy, f"__{name}__", forward)
            setattr(Proxy, f"__r{name}__", reflected)
        for name in ("neg", "pos", "abs", "invert"):
            setattr(Proxy, f"__{name}__", lambda self, name=name: self._request("unary", name=name))

    operator_methods()

    # ------------------------------------------------------------------ imports: the workspace is remote
    hidden = {}
    for relative, source in payload["modules"].items():
        if relative.endswith(".py"):
            name = relative[:-3].replace("/", ".")
            hidden[name[:-9] if name.endswith(".__init__") else name] = (relative, source)
    system_path = list(sys.path)
    repository = set(payload.get("repository", []))  # the pristine tree's top-level modules: the answer's to run

    class AnswerModule(types.ModuleType):
        """A module of the workspace: its attributes live in the answer's process."""

        def __getattr__(self, name):
            remote = self.__dict__.get("_relayrl_remote")
            if remote is None or name.startswith("__"):
                raise AttributeError(name)
            found = getattr(remote, name)
            if isinstance(found, Proxy) and object.__getattribute__(found, "_kind") == "callable":
                paths.setdefault(object.__getattribute__(found, "_rid"), f"{self.__name__}.{name}")
            return found

    packages = set()  # folders of the hidden tests (``tests`` of ``tests/test_x.py``) without an __init__.py
    for name in hidden:
        parts = name.split(".")
        packages.update(".".join(parts[:index]) for index in range(1, len(parts)))
    packages -= set(hidden)

    def in_workspace(name):
        base = os.path.join(root, *name.split("."))
        return os.path.isdir(base) or os.path.isfile(base + ".py")

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        """Hidden test modules from the payload's source; the workspace's modules as proxies; the rest
        (the standard library, installed packages) as usual. In order: the hidden tests, the standard
        library, the repository's own top-level modules (the host names them from the pristine tree),
        installed packages, then modules the answer added: an answer's ``json.py`` or ``numpy/`` does
        not replace what the tests use, and the repository's ``attr/`` wins over an installed one."""

        def find_spec(self, name, path=None, target=None):
            if name in hidden:
                relative = hidden[name][0]
                return importlib.machinery.ModuleSpec(name, self, origin=os.path.join(root, relative),
                                                      is_package=relative.endswith("__init__.py"))
            if name in packages:
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            top = name.partition(".")[0]
            if top not in hidden and top not in packages:
                if top in sys.stdlib_module_names:
                    return None  # the standard library: the driver's own, whatever the workspace holds
                if top not in repository and importlib.machinery.PathFinder.find_spec(top, system_path) is not None:
                    return None  # installed, and not the repository's: an answer's numpy/ replaces nothing here
            return importlib.machinery.ModuleSpec(name, self, is_package=True) if in_workspace(name) else None

        def create_module(self, spec):
            module = AnswerModule(spec.name)
            if spec.submodule_search_locations is not None:
                module.__path__ = []
            if spec.name not in hidden and spec.name not in packages:
                module.__dict__["_relayrl_remote"] = call("import", name=spec.name)
            return module

        def exec_module(self, module):
            if module.__name__ in hidden:
                relative, source = hidden[module.__name__]
                module.__file__ = os.path.join(root, relative)
                exec(compile(source, module.__file__, "exec"), module.__dict__)  # the trusted hidden tests

    sys.meta_path.insert(0, Finder())

    # ------------------------------------------------------------------ running the tests
    class Result(unittest.TestResult):
        def __init__(self):
            super().__init__()
            self.outcomes = {}

        def _id(self, test):
            return f"{type(test).__module__}.{type(test).__qualname__}.{getattr(test, '_testMethodName', '?')}"

        def addSuccess(self, test):
            self.outcomes.setdefault(self._id(test), ("passed", ""))

        def addFailure(self, test, err):
            self.outcomes[self._id(test)] = ("failed", describe(err[1]))

        def addError(self, test, err):
            self.outcomes[self._id(test)] = ("error", describe(err[1]))

        def addSkip(self, test, reason):
            self.outcomes[self._id(test)] = ("skipped", str(reason)[:200])

        def addExpectedFailure(self, test, err):
            self.outcomes[self._id(test)] = ("failed", "an expected failure")

        def addUnexpectedSuccess(self, test):
            self.outcomes[self._id(test)] = ("failed", "an unexpected success")

    def describe(error):
        return f"{type(error).__name__}: {error}"[:500]

    def run_plain(owner, name):
        """A pytest-style test: a function, or a method of a class that is not a TestCase."""
        instance = owner() if isinstance(owner, type) else None
        try:
            if instance is not None and hasattr(instance, "setup_method"):
                instance.setup_method(getattr(instance, name))
            getattr(instance if instance is not None else owner, name)()
            return "passed", ""
        except AssertionError as error:
            return "failed", describe(error)
        except Exception as error:  # a test that errors is not a pass
            return "error", describe(error)
        finally:
            if instance is not None and hasattr(instance, "teardown_method"):
                with contextlib.suppress(Exception):  # clean-up failures do not change the verdict
                    instance.teardown_method(getattr(instance, name))

    def run_tests():
        loaded = {}
        for name in sorted(hidden):
            if name.rpartition(".")[2].startswith("test") or name.endswith("_test"):
                state["deadline"] = time.monotonic() + test_timeout_s
                try:
                    loaded[name] = importlib.import_module(name)
                except BaseException as error:  # the answer breaking an import fails that module's tests
                    emit("load-error", name, describe(error))
        groups = {}
        for test_id in inventory:
            if test_id.startswith("relayrl.check."):
                continue  # the checks on generated inputs, run after the tests
            module_name = next((name for name in sorted(loaded, key=len, reverse=True)
                                if test_id.startswith(name + ".")), None)
            rest = test_id[len(module_name) + 1:] if module_name else ""
            groups.setdefault((module_name, rest.rpartition(".")[0]), []).append((test_id, rest.rpartition(".")[2]))
        for (module_name, class_name), tests in groups.items():
            module = loaded.get(module_name)
            owner = getattr(module, class_name, None) if class_name else module
            if module is None or owner is None:
                for test_id, _ in tests:
                    emit("result", test_id, "error", "the test module did not load" if module is None else "not found")
                continue
            if isinstance(owner, type) and issubclass(owner, unittest.TestCase):
                result = Result()
                state["deadline"] = time.monotonic() + test_timeout_s * (len(tests) + 1)
                unittest.TestSuite([owner(method) for _, method in tests]).run(result)
                for test_id, method in tests:
                    outcome, detail = result.outcomes.get(f"{owner.__module__}.{owner.__qualname__}.{method}",
                                                          ("error", describe_fixture(result) or "no outcome"))
                    emit("result", test_id, outcome, detail)
                continue
            for test_id, method in tests:
                state["deadline"] = time.monotonic() + test_timeout_s
                outcome, detail = run_plain(owner, method)
                emit("result", test_id, outcome, detail)

    # ------------------------------------------------------------------ calls on generated inputs
    def attempt(path, arguments, keywords):
        """Call workspace function ``path`` on encoded plain arguments, in a fresh worker's import:
        ``{"ok": result, "args": arguments after the call}``, or ``{"raise": exception class name}``."""
        state["deadline"] = time.monotonic() + test_timeout_s
        if not state["alive"]:
            start_worker()
        module_name, _, function = path.rpartition(".")
        try:
            args, kwargs = value(arguments), value(keywords)
            result = getattr(importlib.import_module(module_name), function)(*args, **kwargs)
            data = out(result)
            return {"ok": data, "args": out(args)} if plain(data) else {"raise": "a result that is not plain data"}
        except WorkerLost as error:
            return {"raise": f"WorkerLost: {error}"}
        except Exception as error:  # which exception is part of the outcome
            return {"raise": type(error).__name__}

    def close(a, b):
        """Equal as the tests' assertEqual would have it, with floats to 1e-9 (plain data only)."""
        numbers = (int, float)
        if type(a) is bool or type(b) is bool:
            return type(a) is type(b) and a == b
        if type(a) in numbers and type(b) in numbers:
            if type(a) is float or type(b) is float:
                return (a != a and b != b) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
            return a == b
        if type(a) is not type(b):
            return False
        if type(a) in (list, tuple):
            return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b))
        if type(a) is dict:
            return a.keys() == b.keys() and all(close(a[key], b[key]) for key in a)
        return a == b

    def run_probes(probes):
        """Mode ``probe`` (the gold solution): each probe's outcome, twice; an unstable one is dropped."""
        for index, (path, arguments, keywords) in enumerate(probes):
            first = attempt(path, arguments, keywords)
            second = attempt(path, arguments, keywords)
            stable = "ok" in first and "ok" in second and close(value(first["ok"]), value(second["ok"])) \
                and close(value(first["args"]), value(second["args"]))
            stable = stable or ("raise" in first and first == second)
            emit("probe", str(index), json.dumps(first) if stable else "unstable")

    def run_checks(checks):
        """The answer on the generated inputs, against the gold solution's outcomes (held here only)."""
        for index, (path, arguments, keywords, expected) in enumerate(checks):
            outcome = attempt(path, arguments, keywords)
            if "raise" in expected:
                passed = outcome.get("raise") == expected["raise"]
            else:
                passed = "ok" in outcome and close(value(outcome["ok"]), value(expected["ok"])) \
                    and close(value(outcome["args"]), value(expected["args"]))
            emit("result", f"relayrl.check.{index}", "passed" if passed else "failed",
                 "" if passed else f"{path} on a generated input: the answer differs from the gold solution")

    status = 3
    try:
        emit("start", PROTOCOL, ",".join(protections), sys.version.split()[0], str(len(inventory)))
        start_worker()
        if mode == "probe":
            run_probes(payload.get("probes") or [])
        else:
            run_tests()
            for path, arguments, keywords in calls:  # mode "record"
                emit("call", path, json.dumps([arguments, keywords]))
            if payload.get("checks"):
                start_worker()  # the checks see a fresh import, as the gold solution's probes did
                run_checks(payload["checks"])
        emit("end", str(len(inventory)))
        status = 0
    except BaseException as error:  # a driver crash is reported, never a pass
        with contextlib.suppress(BaseException):  # nothing left to report with
            emit("crash", describe(error))
    finally:
        stop_worker()
        os._exit(status)


def describe_fixture(result):
    """The first class- or module-fixture error of a unittest result, in one line."""
    for test, text in result.errors:
        return f"{test}: {text.strip().splitlines()[-1]}"[:500]
    return ""


if __name__ == "__main__":
    import sys as _sys

    if len(_sys.argv) == 3 and _sys.argv[1] == "worker":
        worker(_sys.argv[2])
    else:
        driver()
