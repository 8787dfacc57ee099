"""relayrl's grading runner: runs a task's hidden tests beside an answer and reports signed evidence.

This file is a standalone script (standard library only, Python >= 3.10). The grader copies it into
the grading sandbox and runs it as ``python3 -I -B runner.py`` with a JSON payload on stdin::

    {"key": HEX, "root": DIR, "modules": {"tests/test_x.py": SOURCE, ...},
     "inventory": ["tests.test_x.TestX.test_a", ...]}

It reports on its original stdout, one line per record::

    RELAYRL-EVIDENCE <seq> <hmac-sha256 hex> <repr of a tuple of strings>

``start``, then one ``result`` per inventory id (``passed``, ``failed``, ``error``, ``skipped``,
``missing``), ``flag`` records (runtime evidence of cheating), and ``end``. The host
(:mod:`relayrl.sandbox.evidence`) pays only when every expected test has exactly one ``passed``
record, the sequence is complete and every MAC verifies; anything else earns 0.

Why the answer's code cannot forge or bend the verdict, although it runs in this process:

* **The key is read before any answer code runs** and lives only in closures of a driver thread.
  Reaching it needs a frame or the object graph, and audit hooks, installed before the first
  answer import, deny every way to get one (``sys._getframe``, ``sys._current_frames``,
  ``tb_frame``/``gi_frame``/``cr_frame``/``ag_frame``, ``sys.settrace``/``setprofile``, ``gc``
  introspection, importing ``ctypes`` or native modules, ``/proc/self/mem``, sub-interpreters).
  Signal handlers run in the main thread, which holds nothing (the tests run in the driver
  thread). The runner makes itself non-dumpable (``prctl``) before any answer code exists: no
  other process of the sandbox can ptrace it or read its memory (the host pays nothing when it
  could not). Signing
  uses C functions captured at start-up, so no monkeypatch changes what is signed.
* **The hidden tests never touch the disk**: their source arrives on stdin, and their code objects
  are protected (reading ``__code__``, ``__defaults__`` of a test function is denied and flagged).
* **The tests cannot be bent**: ``==``, ``!=``, ``in``, ordering, ``assert*`` calls, ``with
  self.assertRaises``, the builtins and every ``self.x`` of the hidden tests are rewritten to the
  runner's own code, embedded in the compiled tests as constants: comparisons check plain data
  structurally and refuse to trust an ``__eq__`` (or ``__bool__``, ``__contains__`` ...) the answer
  defined; attributes come from the test classes' members as they were when each class was
  created, and the test functions run on a private copy of their module's globals, so replacing a
  method, a class attribute or a global that the answer can reach changes nothing the tests use.
  The runner decides each outcome itself (no ``unittest`` result object or runner is involved),
  and calls only test functions whose code is the code it compiled.
* **Runtime evidence**: ``exec`` of the runner, killing it, tracing, frame and ``gc`` walking,
  ``ctypes``, reading the tests' code, rewriting them, network use: each is denied where it would
  matter and reported as a ``flag`` record; a premature exit leaves the record stream incomplete.

What is not covered (docs/sandbox.md says so too): the hidden tests' module-level and class-level
*data* can be read by answer code that enumerates classes (their code cannot); the stdlib modules
the tests call into (``math``, ``re`` ...) can be patched by the answer, which the runner detects
between tests (``flag``) for ``builtins`` and ``unittest`` but not for every module, nor for a
change made and undone within one test. Exploits of CPython itself (crafted bytecode) are out of
scope, like kernel exploits.
"""

RECORD_PREFIX = "RELAYRL-EVIDENCE"
PROTOCOL = "1"


def main():
    import _hashlib
    import _thread
    import ast
    import builtins
    import gc
    import json
    import operator
    import os
    import sys
    import types
    import warnings

    # ------------------------------------------------------------------ payload, before any answer code
    chunks = []
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    payload = json.loads(b"".join(chunks))
    del chunks
    pristine_builtins = dict(builtins.__dict__)
    key = bytes.fromhex(payload["key"])
    root = payload["root"]
    inventory = list(payload["inventory"])
    record_fd = os.dup(1)  # the record stream; the tests' own prints go to stderr from now on
    os.dup2(2, 1)

    hmac_digest, write, get_ident, exit_now = _hashlib.hmac_digest, os.write, _thread.get_ident, os._exit
    str_, repr_, tuple_, type_, len_ = str, repr, tuple, type, len
    sequence = [0]

    def emit(*fields):
        body = repr_(tuple_(f if type_(f) is str_ else "<not a string>" for f in fields))
        seq = str_(sequence[0])
        sequence[0] += 1
        mac = hmac_digest(key, (seq + "|" + body).encode(), "sha256").hex()
        data = (RECORD_PREFIX + " " + seq + " " + mac + " " + body + "\n").encode()
        while data:
            data = data[write(record_fd, data):]

    if sys.version_info < (3, 10):  # noqa: UP036 - the sandbox's python3 is not the host's
        emit("start", PROTOCOL, "unsupported", sys.version.split()[0])
        emit("end", "0")
        exit_now(0)

    # ------------------------------------------------------------------ what the process is
    protections = []
    # Non-dumpable before any answer code runs (prctl): no other process of the sandbox can ptrace
    # this one, read /proc/PID/mem or reach its descriptors. The host pays nothing without it. ctypes
    # leaves sys.modules again, so that an answer's import of it is a real import the hooks deny.
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(4, 0, 0, 0, 0) == 0 and libc.prctl(3, 0, 0, 0, 0) == 0:  # PR_SET_/PR_GET_DUMPABLE
            protections.append("non-dumpable")
        del libc, ctypes
    except (ImportError, OSError, AttributeError):
        pass
    for name in [name for name in sys.modules if name in ("ctypes", "_ctypes") or name.startswith("ctypes.")]:
        del sys.modules[name]
    window = [False]  # the runner's own reads of protected attributes, in the driver thread only

    import re
    import traceback
    import unittest
    import unittest.case
    import unittest.loader
    import unittest.result
    import unittest.suite

    # It walks tb_frame, which the audit hook denies; it only frees memory. Built on globals of its
    # own: a function defined here would hand this runner's namespace to whoever reads __globals__.
    traceback.clear_frames = eval("lambda tb: None", {"__builtins__": {}})
    infrastructure = [module for name, module in sys.modules.items()
                      if name == "unittest" or name.startswith("unittest.")]
    TestCase = unittest.TestCase
    testcase_members = dict(TestCase.__dict__)  # the originals, before any answer code could replace one
    instance_dict_of = TestCase.__dict__["__dict__"].__get__
    object_new = object.__new__
    MethodType = types.MethodType
    object_getattribute = object.__getattribute__

    # ------------------------------------------------------------------ trust of comparison code
    # Whose ``__eq__`` (``__bool__``, ``__contains__`` ...) may decide a comparison? Code that existed
    # before the first answer import: C types, and the members of every class alive now (the stdlib
    # classes tests compare against are imported first). Not code the answer wrote, nor a member it
    # replaced on an old class, nor anything whose file name it chose (compile() takes any name).
    for name in ("collections", "datetime", "decimal", "enum", "fractions", "ipaddress", "pathlib", "uuid"):
        __import__(name)  # classes that tests compare against: their members are known before any answer code

    heap_type = 1 << 9
    FunctionType = types.FunctionType
    guarded = ("__eq__", "__ne__", "__hash__", "__len__", "__iter__", "__getitem__", "__contains__", "__bool__",
               "__lt__", "__le__", "__gt__", "__ge__", "__index__", "__int__", "__float__", "__complex__",
               "__sub__", "__rsub__", "__abs__", "__round__", "keys", "items", "values", "__class__")
    class_members = {}  # hidden class -> its members at creation (functions rebuilt with private globals)
    class_mro = {}  # hidden class -> its MRO at creation
    missing = object()
    known_members = {}  # (id of a class, member name) -> the member before any answer code ran
    known_classes = []  # kept alive: their ids stay theirs
    for candidate in gc.get_objects():
        if isinstance(candidate, type):
            known_classes.append(candidate)
            members = candidate.__dict__
            for name in guarded:
                if name in members:
                    known_members[(id(candidate), name)] = members[name]
    del candidate

    def code_of(function):
        window[0] = True  # a hidden test's own helper class may be compared; reading its code runs nothing
        try:
            return function.__code__
        finally:
            window[0] = False

    def trusted(tp, name):
        """Whether the ``name`` member that ``tp`` uses (``__eq__`` ...) is code the answer did not write."""
        for cls in tp.__mro__:
            members = class_members.get(cls)
            if members is None:
                members = cls.__dict__
            if name in members:
                impl = members[name]
                if not cls.__flags__ & heap_type:
                    return True  # a static type: immutable, and implemented in C
                if cls in class_mro:  # a hidden test's own class: its members as created
                    return type_(impl) is not FunctionType or id(code_of(impl)) in my_codes
                return known_members.get((id(cls), name), missing) is impl
        return True

    # ------------------------------------------------------------------ strict comparisons
    NoneType = type_(None)
    plain_bases = (bool, int, float, complex, str, bytes, NoneType, list, tuple, dict, set, frozenset)
    numbers = (bool, int, float, complex)

    class Unverifiable(Exception):
        """A comparison that depends on code the answer wrote."""

    def plain_base(value):
        tp = type_(value)
        for base in plain_bases:
            if tp is base:
                return base
        for base in plain_bases:
            if base is not bool and base is not NoneType and issubclass(tp, base):
                for cls in tp.__mro__:
                    if cls is base:
                        return base
                    members = cls.__dict__
                    for name in guarded:
                        if name in members:
                            return None
        return None

    def as_base(value, base):
        return value if type_(value) is base else base(value)

    def strict_eq(a, b, depth=0):
        if depth > 200:
            raise Unverifiable("structure nested more than 200 levels")
        if a is b and (depth or type_(a) is not float):
            return True  # as Python's containers do; a lone NaN is unequal to itself, as in unittest
        base_a, base_b = plain_base(a), plain_base(b)
        if base_a is not None and base_b is not None:
            if base_a in numbers and base_b in numbers:
                return as_base(a, base_a) == as_base(b, base_b)
            if base_a in (set, frozenset) and base_b in (set, frozenset):
                left, right = frozenset(a), frozenset(b)
                if not (all(plain_deep(item) for item in left) and all(plain_deep(item) for item in right)):
                    raise Unverifiable("set of objects whose equality the answer may define")
                return frozenset.__eq__(left, right)
            if base_a is not base_b:
                return False
            if base_a in (str, bytes):
                return base_a.__eq__(a, b)
            if base_a is NoneType:
                return True
            if base_a in (list, tuple):
                size = base_a.__len__(a)
                if size != base_b.__len__(b):
                    return False
                return all(strict_eq(base_a.__getitem__(a, i), base_b.__getitem__(b, i), depth + 1)
                           for i in range(size))
            if dict.__len__(a) != dict.__len__(b):
                return False
            for item in dict.__iter__(a):
                if not plain_deep(item):
                    raise Unverifiable("dict key whose equality the answer may define")
                if not dict.__contains__(b, item):
                    return False
                if not strict_eq(dict.__getitem__(a, item), dict.__getitem__(b, item), depth + 1):
                    return False
            return True
        if (base_a is None and not trusted(type_(a), "__eq__")) or (base_b is None and not trusted(type_(b), "__eq__")):
            if base_a is None and base_b is None and type_(a) is type_(b):
                return bool(a == b)  # one class on both sides: its own equality is what is tested
            culprit = type_(a) if base_a is None and not trusted(type_(a), "__eq__") else type_(b)
            raise Unverifiable(f"{culprit.__qualname__}.__eq__ is defined by the answer")
        return bool(a == b)

    def plain_deep(value, depth=0):
        base = plain_base(value)
        if base is None or depth > 50:
            return False
        if base in (list, tuple, set, frozenset):
            return all(plain_deep(item, depth + 1) for item in value)
        if base is dict:
            return all(plain_deep(k, depth + 1) and plain_deep(v, depth + 1) for k, v in dict.items(value))
        return True

    def truth(value):
        if plain_base(value) is not None:
            return bool(value)
        tp = type_(value)
        if trusted(tp, "__bool__") and trusted(tp, "__len__"):
            return bool(value)
        raise Unverifiable(f"the truth of {tp.__qualname__} is defined by the answer")

    def contains(item, container):
        base = plain_base(container)
        if base in (list, tuple):
            return any(strict_eq(item, element) for element in container)
        if base in (str, bytes):
            if plain_base(item) not in (str, bytes):
                raise Unverifiable("membership in a string of a non-string")
            return base.__contains__(container, item)
        if base in (dict, set, frozenset):
            if not plain_deep(item):
                if trusted(type_(item), "__eq__") and trusted(type_(item), "__hash__"):
                    return item in container
                raise Unverifiable(f"{type_(item).__qualname__} equality is defined by the answer")
            return base.__contains__(container, item)
        if base is None and trusted(type_(container), "__iter__"):
            # Its own __contains__ would compare with the elements' __eq__, possibly the answer's.
            return any(strict_eq(item, element) for element in list(container))
        raise Unverifiable(f"membership in {type_(container).__qualname__} is defined by the answer")

    order_ops = {"Lt": lambda a, b: a < b, "LtE": lambda a, b: a <= b, "Gt": lambda a, b: a > b,
                 "GtE": lambda a, b: a >= b}
    order_names = {"Lt": "__lt__", "LtE": "__le__", "Gt": "__gt__", "GtE": "__ge__"}

    def ordered(op, a, b):
        for value in (a, b):
            base = plain_base(value)
            if base is None and not trusted(type_(value), order_names[op]):
                raise Unverifiable(f"ordering of {type_(value).__qualname__} is defined by the answer")
            if base in (list, tuple, dict, set, frozenset) and not plain_deep(value):
                raise Unverifiable("ordering of containers of objects the answer may define")
        return bool(order_ops[op](a, b))

    def compare(op, a, b):
        if op == "Eq":
            return strict_eq(a, b)
        if op == "NotEq":
            return not strict_eq(a, b)
        if op == "In":
            return contains(a, b)
        if op == "NotIn":
            return not contains(a, b)
        return ordered(op, a, b)

    # ------------------------------------------------------------------ assertions (the tests call these)
    def short(value):
        try:
            text = repr_(value)
        except BaseException:  # an answer's __repr__ may raise anything
            text = f"<{type_(value).__qualname__}>"
        text = text if type_(text) is str_ else "<repr>"
        return text if len_(text) <= 200 else text[:200] + "..."

    def fail_with(message, msg=None):
        raise AssertionError(message if msg is None else f"{message} : {msg}")

    def a_equal(self, first, second, msg=None):
        if not strict_eq(first, second):
            fail_with(f"{short(first)} != {short(second)}", msg)

    def a_not_equal(self, first, second, msg=None):
        if strict_eq(first, second):
            fail_with(f"{short(first)} == {short(second)}", msg)

    def a_true(self, expr, msg=None):
        if not truth(expr):
            fail_with(f"{short(expr)} is not true", msg)

    def a_false(self, expr, msg=None):
        if truth(expr):
            fail_with(f"{short(expr)} is not false", msg)

    def a_is(self, first, second, msg=None):
        if first is not second:
            fail_with(f"{short(first)} is not {short(second)}", msg)

    def a_is_not(self, first, second, msg=None):
        if first is second:
            fail_with(f"unexpectedly identical: {short(first)}", msg)

    def a_is_none(self, obj, msg=None):
        if obj is not None:
            fail_with(f"{short(obj)} is not None", msg)

    def a_is_not_none(self, obj, msg=None):
        if obj is None:
            fail_with("unexpectedly None", msg)

    def a_in(self, member, container, msg=None):
        if not contains(member, container):
            fail_with(f"{short(member)} not found in {short(container)}", msg)

    def a_not_in(self, member, container, msg=None):
        if contains(member, container):
            fail_with(f"{short(member)} unexpectedly found in {short(container)}", msg)

    def a_is_instance(self, obj, cls, msg=None):
        if not issubclass(type_(obj), cls):
            fail_with(f"{short(obj)} is not an instance of {short(cls)}", msg)

    def a_not_is_instance(self, obj, cls, msg=None):
        if issubclass(type_(obj), cls):
            fail_with(f"{short(obj)} is an instance of {short(cls)}", msg)

    def a_almost_equal(self, first, second, places=None, msg=None, delta=None):
        if strict_eq(first, second):
            return
        if plain_base(first) not in numbers or plain_base(second) not in numbers:
            raise Unverifiable("assertAlmostEqual of values that are not plain numbers")
        difference = abs(as_base(first, plain_base(first)) - as_base(second, plain_base(second)))
        close = difference <= delta if delta is not None else round(difference, 7 if places is None else places) == 0
        if not close:
            fail_with(f"{short(first)} != {short(second)} within tolerance", msg)

    def a_not_almost_equal(self, first, second, places=None, msg=None, delta=None):
        try:
            a_almost_equal(self, first, second, places, None, delta)
        except AssertionError:
            return
        fail_with(f"{short(first)} == {short(second)} within tolerance", msg)

    def typed_equal(kind):
        def check(self, first, second, msg=None, seq_type=None):
            for value in (first, second):
                if kind is not None and not issubclass(type_(value), kind):
                    fail_with(f"{short(value)} is not a {kind.__name__}", msg)
            a_equal(self, first, second, msg)
        return check

    def a_count_equal(self, first, second, msg=None):
        left, right = list(first), list(second)
        unmatched = list(right)
        for item in left:
            for index, candidate in enumerate(unmatched):
                if strict_eq(item, candidate):
                    del unmatched[index]
                    break
            else:
                fail_with(f"element counts differ: {short(item)} is extra", msg)
        if unmatched:
            fail_with(f"element counts differ: {short(unmatched[0])} is missing", msg)

    def ordering(op, word):
        def check(self, a, b, msg=None):
            if not ordered(op, a, b):
                fail_with(f"{short(a)} not {word} {short(b)}", msg)
        return check

    def a_regex(self, text, expected_regex, msg=None):
        if plain_base(text) not in (str, bytes):
            raise Unverifiable("assertRegex on a value that is not a plain string")
        if not re_search(expected_regex, as_base(text, plain_base(text))):
            fail_with(f"regex {short(expected_regex)} did not match {short(text)}", msg)

    def a_not_regex(self, text, unexpected_regex, msg=None):
        if plain_base(text) not in (str, bytes):
            raise Unverifiable("assertNotRegex on a value that is not a plain string")
        if re_search(unexpected_regex, as_base(text, plain_base(text))):
            fail_with(f"regex {short(unexpected_regex)} matched {short(text)}", msg)

    def a_fail(self, msg=None):
        raise AssertionError(msg)

    def raised_ok(error, expected, pattern=None):
        if not issubclass(type_(error), expected):
            return False
        if pattern is not None:
            try:
                message = str_(error)
            except BaseException:  # an answer's __str__ may raise anything
                return False
            if type_(message) is not str_ or not re_search(pattern, message):
                raise AssertionError(f"{short(pattern)} does not match {short(message)}")
        return True

    def not_raised(expected):
        raise AssertionError(f"{getattr(expected, '__name__', short(expected))} not raised")

    def a_raises(self, expected, *args, **kwargs):
        if not args:
            raise Unverifiable("assertRaises without a callable outside a with statement")
        function, *rest = args
        try:
            function(*rest, **kwargs)
        except BaseException as error:  # the expected class decides
            if raised_ok(error, expected):
                return error
            raise
        not_raised(expected)

    def a_raises_regex(self, expected, pattern, *args, **kwargs):
        if not args:
            raise Unverifiable("assertRaisesRegex without a callable outside a with statement")
        function, *rest = args
        try:
            function(*rest, **kwargs)
        except BaseException as error:  # the expected class decides
            if raised_ok(error, expected, pattern):
                return error
            raise
        not_raised(expected)

    re_search = re.search
    SimpleNamespace = types.SimpleNamespace
    assertions = {
        "assertEqual": a_equal, "assertEquals": a_equal, "failUnlessEqual": a_equal,
        "assertNotEqual": a_not_equal, "assertNotEquals": a_not_equal,
        "assertTrue": a_true, "assert_": a_true, "failUnless": a_true, "assertFalse": a_false, "failIf": a_false,
        "assertIs": a_is, "assertIsNot": a_is_not, "assertIsNone": a_is_none, "assertIsNotNone": a_is_not_none,
        "assertIn": a_in, "assertNotIn": a_not_in, "assertIsInstance": a_is_instance,
        "assertNotIsInstance": a_not_is_instance, "assertAlmostEqual": a_almost_equal,
        "assertAlmostEquals": a_almost_equal, "assertNotAlmostEqual": a_not_almost_equal,
        "assertListEqual": typed_equal(list), "assertTupleEqual": typed_equal(tuple),
        "assertDictEqual": typed_equal(dict), "assertSetEqual": typed_equal(None),
        "assertSequenceEqual": typed_equal(None), "assertMultiLineEqual": typed_equal(str),
        "assertCountEqual": a_count_equal, "assertGreater": ordering("Gt", ">"),
        "assertGreaterEqual": ordering("GtE", ">="), "assertLess": ordering("Lt", "<"),
        "assertLessEqual": ordering("LtE", "<="), "assertRegex": a_regex, "assertNotRegex": a_not_regex,
        "fail": a_fail, "assertRaises": a_raises, "assertRaisesRegex": a_raises_regex,
    }

    # ------------------------------------------------------------------ the tests' own attributes
    # A test reads ``self.expected`` or calls ``self.check(...)``: through the class, which the
    # answer's code can reach (``TestCase.__subclasses__()``) and change. The hidden tests' attribute
    # accesses on their receiver go through these instead, which look in the class members as they
    # were when the class was created (and in TestCase's originals), never in the live classes.
    class_members.clear()
    operators = {ast.Add: operator.iadd, ast.Sub: operator.isub, ast.Mult: operator.imul, ast.Div: operator.itruediv,
                 ast.FloorDiv: operator.ifloordiv, ast.Mod: operator.imod, ast.Pow: operator.ipow,
                 ast.LShift: operator.ilshift, ast.RShift: operator.irshift, ast.BitOr: operator.ior,
                 ast.BitXor: operator.ixor, ast.BitAnd: operator.iand, ast.MatMult: operator.imatmul}

    def class_lookup(cls, name):
        for klass in class_mro[cls]:
            members = class_members.get(klass)
            if members is None:
                members = testcase_members if klass is TestCase else klass.__dict__
            if name in members:
                return members[name]
        return missing

    def is_data_descriptor(value):
        kind = type_(value)
        return hasattr(kind, "__set__") or hasattr(kind, "__delete__")

    def class_attr(cls, name):
        found = class_lookup(cls, name)
        if found is missing:
            raise AttributeError(f"type object {cls.__qualname__!r} has no attribute {name!r}")
        getter = getattr(type_(found), "__get__", None)
        if getter is None or type_(found) is FunctionType:
            return found
        return getter(found, None, cls)

    def get_attr(obj, name):
        if type_(obj) is type and obj in class_mro:  # cls.X in a classmethod of a hidden class
            return class_attr(obj, name)
        cls = type_(obj)
        if cls not in class_mro:
            return getattr(obj, name)
        found = class_lookup(cls, name)
        if found is not missing and is_data_descriptor(found):
            return found.__get__(obj, cls)
        own = instance_dict_of(obj) if isinstance(obj, TestCase) else object_getattribute(obj, "__dict__")
        if name in own:
            return own[name]
        if found is missing:
            raise AttributeError(f"{cls.__qualname__!r} object has no attribute {name!r}")
        if type_(found) is FunctionType:
            return MethodType(found, obj)
        getter = getattr(type_(found), "__get__", None)
        return getter(found, obj, cls) if getter is not None else found

    def set_attr(obj, name, value):
        if type_(obj) is type and obj in class_mro:  # setUpClass: cls.shared = ...
            class_members[obj][name] = value
            return None
        cls = type_(obj)
        if cls not in class_mro:
            return setattr(obj, name, value)
        found = class_lookup(cls, name)
        if found is not missing and is_data_descriptor(found):
            return found.__set__(obj, value)
        own = instance_dict_of(obj) if isinstance(obj, TestCase) else object_getattribute(obj, "__dict__")
        own[name] = value
        return None

    def update_attr(obj, name, op, value):
        set_attr(obj, name, operators[op](get_attr(obj, name), value))

    # ------------------------------------------------------------------ rewriting the hidden tests
    nonce = os.urandom(8).hex()
    constants = {}

    def const(value, label):
        marker = f"\x00relayrl-{nonce}-{len_(constants)}-{label}"
        constants[marker] = value
        return ast.Constant(value=marker)

    ops = {ast.Eq: "Eq", ast.NotEq: "NotEq", ast.In: "In", ast.NotIn: "NotIn", ast.Lt: "Lt", ast.LtE: "LtE",
           ast.Gt: "Gt", ast.GtE: "GtE"}
    # super stays a name: zero-argument super() needs the compiler to see it (the __class__ cell).
    builtin_names = set(dir(builtins)) - {"__name__", "__doc__", "__package__", "__loader__", "__spec__",
                                          "__build_class__", "__import__", "__debug__", "super"}

    def bound_names(tree):
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                names.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[0])
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, (ast.Global, ast.Nonlocal)):
                names.update(node.names)
            elif (isinstance(node, ast.ExceptHandler) and node.name) or (isinstance(node, ast.MatchAs) and node.name):
                names.add(node.name)
        return names

    class Rewriter(ast.NodeTransformer):
        """Comparisons, ``self.assert*`` calls, ``with self.assertRaises`` and builtins -> the runner's code."""

        def __init__(self, shadowed):
            self.shadowed = shadowed
            self.receivers = []
            self.counter = 0

        def visit_FunctionDef(self, node):
            self.receivers.append(node.args.args[0].arg if node.args.args else None)
            self.generic_visit(node)
            self.receivers.pop()
            return node

        visit_AsyncFunctionDef = visit_FunctionDef

        def visit_Lambda(self, node):
            self.receivers.append(None)
            self.generic_visit(node)
            self.receivers.pop()
            return node

        def visit_Compare(self, node):
            self.generic_visit(node)
            if len_(node.ops) != 1 or type_(node.ops[0]) not in ops:
                return node
            call = ast.Call(func=const(compare, "compare"),
                            args=[ast.Constant(value=ops[type_(node.ops[0])]), node.left, node.comparators[0]],
                            keywords=[])
            return ast.copy_location(call, node)

        def _assertion(self, node):
            func = getattr(node, "func", None)
            if (isinstance(node, ast.Call) and isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                    and func.value.id in self.receivers):
                return func.attr, func.value
            return None, None

        def visit_Call(self, node):
            name, receiver = self._assertion(node)
            if name in assertions:
                call = ast.Call(func=const(assertions[name], name),
                                args=[receiver, *(self.visit(argument) for argument in node.args)],
                                keywords=[self.visit(keyword) for keyword in node.keywords])
                return ast.copy_location(call, node)
            self.generic_visit(node)
            return node

        def _own(self, node):
            return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in self.receivers)

        def visit_Attribute(self, node):
            if self._own(node) and isinstance(node.ctx, ast.Load):
                return ast.copy_location(ast.Call(func=const(get_attr, "get_attr"),
                                                  args=[node.value, ast.Constant(value=node.attr)], keywords=[]), node)
            self.generic_visit(node)
            return node

        def visit_Assign(self, node):
            if len_(node.targets) == 1 and self._own(node.targets[0]):
                target = node.targets[0]
                call = ast.Call(func=const(set_attr, "set_attr"),
                                args=[target.value, ast.Constant(value=target.attr), self.visit(node.value)],
                                keywords=[])
                return ast.copy_location(ast.Expr(value=call), node)
            self.generic_visit(node)
            return node

        def visit_AugAssign(self, node):
            if self._own(node.target) and type_(node.op) in operators:
                target = node.target
                call = ast.Call(func=const(update_attr, "update_attr"),
                                args=[target.value, ast.Constant(value=target.attr), const(type_(node.op), "op"),
                                      self.visit(node.value)], keywords=[])
                return ast.copy_location(ast.Expr(value=call), node)
            self.generic_visit(node)
            return node

        def visit_With(self, node):
            if len_(node.items) != 1:
                self.generic_visit(node)
                return node
            item = node.items[0]
            name, _ = self._assertion(item.context_expr)
            if name == "subTest":
                node.body = [self.visit(statement) for statement in node.body]
                return node.body  # a failing sub-test fails the test; nothing else to do
            if (name not in ("assertRaises", "assertRaisesRegex") or not isinstance(item.optional_vars, (ast.Name, type(None)))
                    or any(keyword.arg != "msg" for keyword in item.context_expr.keywords)):
                self.generic_visit(node)
                return node
            arguments = [self.visit(argument) for argument in item.context_expr.args]
            if (name == "assertRaises" and len_(arguments) != 1) or (name == "assertRaisesRegex" and len_(arguments) != 2):
                self.generic_visit(node)
                return node
            body = [self.visit(statement) for statement in node.body]
            self.counter += 1
            error = f"_relayrl_error_{nonce}_{self.counter}"
            check = ast.Call(func=const(raised_ok, "raised_ok"),
                             args=[ast.Name(id=error, ctx=ast.Load()), *arguments], keywords=[])
            handler = [ast.If(test=ast.UnaryOp(op=ast.Not(), operand=check), body=[ast.Raise()], orelse=[])]
            before = []
            if item.optional_vars is not None:
                target = item.optional_vars
                before.append(ast.Assign(targets=[target], value=ast.Call(
                    func=const(SimpleNamespace, "namespace"), args=[],
                    keywords=[ast.keyword(arg="exception", value=ast.Constant(value=None))])))
                handler.append(ast.Assign(targets=[ast.Attribute(value=ast.Name(id=target.id, ctx=ast.Load()),
                                                                 attr="exception", ctx=ast.Store())],
                                          value=ast.Name(id=error, ctx=ast.Load())))
            statement = ast.Try(
                body=body,
                handlers=[ast.ExceptHandler(type=const(BaseException, "BaseException"), name=error, body=handler)],
                orelse=[ast.Expr(value=ast.Call(func=const(not_raised, "not_raised"), args=[arguments[0]],
                                                keywords=[]))],
                finalbody=[])
            result = [*before, statement]
            for new in result:
                ast.copy_location(new, node)
                ast.fix_missing_locations(new)
            return result

        def visit_Name(self, node):
            if isinstance(node.ctx, ast.Load) and node.id in builtin_names and node.id not in self.shadowed:
                return ast.copy_location(const(getattr(builtins, node.id), node.id), node)
            return node

    def adopt_after_classes(body):
        out = []
        for statement in body:
            out.append(statement)
            if isinstance(statement, ast.ClassDef):
                out.append(ast.copy_location(ast.Expr(value=ast.Call(
                    func=const(adopt_class, "adopt"), args=[ast.Name(id=statement.name, ctx=ast.Load())],
                    keywords=[])), statement))
        return out

    CodeType = types.CodeType

    def substitute(code):
        consts = []
        for value in code.co_consts:
            if type_(value) is str_ and value in constants:
                value = constants[value]
            elif type_(value) is CodeType:
                value = substitute(value)
            consts.append(value)
        return code.replace(co_consts=tuple_(consts))

    protected = []  # hidden-test functions and classes (kept alive, so ids stay theirs)
    protected_ids = set()

    def protect(value):
        if type_(value) in (staticmethod, classmethod):
            value = value.__func__
        if type_(value) is FunctionType and id(value) not in protected_ids:
            protected.append(value)
            protected_ids.add(id(value))

    class_created = {}  # hidden class -> its members at creation, to tell later changes (evidence)

    def adopt_class(cls):
        """Right after a hidden class statement: keep its members and MRO as they are now."""
        if type_(cls) is not type:
            return cls
        class_members[cls] = dict(cls.__dict__)
        class_created[cls] = dict(cls.__dict__)
        class_mro[cls] = cls.__mro__
        for value in class_members[cls].values():
            protect(value)
        return cls

    modules = []
    for relative, source in sorted(payload["modules"].items()):
        name = relative[:-3].replace("/", ".")
        if name.endswith(".__init__"):
            name = name[: -len(".__init__")]
        filename = os.path.join(root, relative)
        try:
            tree = ast.parse(source, filename)
            tree.body = adopt_after_classes(tree.body)
            tree = ast.fix_missing_locations(Rewriter(bound_names(tree)).visit(tree))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "'str' object is not callable": the constants are replaced below
                code = substitute(compile(tree, filename, "exec", dont_inherit=True))
        except (SyntaxError, ValueError, TypeError) as error:
            modules.append((name, relative, None, f"{type_(error).__name__}: {error}"))
            continue
        modules.append((name, relative, code, None))
    del payload, Rewriter
    gc.collect()  # the rewriter class held closures of this function: it must not stay reachable
    if any(cls.__name__ == "Rewriter" for cls in ast.NodeTransformer.__subclasses__()):
        emit("crash", "the test rewriter is still reachable")
        exit_now(3)

    my_codes = set()

    def collect_codes(code):
        my_codes.add(id(code))
        for value in code.co_consts:
            if type_(value) is CodeType:
                collect_codes(value)

    for _, _, code, _ in modules:
        if code is not None:
            collect_codes(code)

    # ------------------------------------------------------------------ the audit hook
    flags = []
    pid = os.getpid()
    armed = [False]
    # The attributes CPython audits (object.__getattr__/__setattr__). frame.f_back, f_locals and a
    # function's __globals__ and __closure__ are not audited: hence no frame may be reachable at all,
    # and no function of this runner (docs/sandbox.md lists what stays readable).
    frame_attributes = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
    code_attributes = frozenset({"__code__", "__defaults__", "__kwdefaults__"})
    forbidden_modules = frozenset({"ctypes", "_ctypes", "_xxsubinterpreters", "_xxinterpchannels", "_testcapi",
                                   "_testinternalcapi", "_testmultiphase", "_testbuffer", "_testimportmultiple",
                                   "cffi", "_cffi_backend"})
    introspection = frozenset({"sys._current_frames", "sys.settrace", "sys.setprofile", "gc.get_objects",
                               "gc.get_referrers", "gc.get_referents", "sys._getframemodulename"})
    network = frozenset({"socket.connect", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
                         "socket.gethostbyname", "socket.gethostbyaddr", "socket.bind"})
    getcwd, getpid, getpgid, lstat, readlink, startswith = (os.getcwd, os.getpid, os.getpgid, os.lstat, os.readlink,
                                                           str.startswith)
    system_dirs = tuple_(sorted({os.path.dirname(os.__file__)} | {p for p in sys.path if "-packages" in p}))
    hidden_dirs = tuple_(sorted({root.rstrip("/") + "/" + rel.split("/", 1)[0] + "/"
                                 for rel in (m[1] for m in modules) if "/" in rel}))

    def realpath(path):
        """``os.path.realpath`` from C functions only: the answer can patch posixpath, not these."""
        if not startswith(path, "/"):
            path = getcwd() + "/" + path
        pending = path.split("/")[::-1]
        resolved, hops = "", 0
        while pending:
            part = pending.pop()
            if part in ("", "."):
                continue
            if part == "..":
                resolved = resolved[: resolved.rfind("/")]
                continue
            candidate = resolved + "/" + part
            try:
                link = lstat(candidate).st_mode & 0o170000 == 0o120000
            except OSError:
                link = False
            if not link or hops > 40:
                resolved = candidate
                continue
            hops += 1
            target = readlink(candidate)
            if startswith(target, "/"):
                resolved = ""
            pending.extend(target.split("/")[::-1])
        return resolved or "/"

    noted = set()

    def note(detector, evidence):
        entry = (detector, evidence[:400])
        if entry not in noted:  # the same tampering seen after every test is one piece of evidence
            noted.add(entry)
            flags.append(entry)

    def deny(detector, evidence, error=PermissionError):
        if detector:
            note(detector, evidence)
        raise error(f"relayrl grader: {evidence} is not allowed while an answer is graded")

    fspath = os.fspath

    def as_path(path):
        try:
            path = fspath(path)  # str, bytes or a path object (its __fspath__ may be the answer's: guarded)
        except BaseException:  # a path object's __fspath__ may be the answer's
            return None
        if type_(path) is bytes:
            path = path.decode(errors="replace")
        return path if type_(path) is str_ else None

    def proc_target(path):
        path = as_path(path)
        if path is None:
            return None
        resolved = realpath(path)
        parts = resolved.split("/")
        if len_(parts) > 2 and parts[1] == "proc" and (parts[2].isdigit() or parts[2] in ("self", "thread-self")):
            return resolved
        return None

    reading = set()  # threads whose hook is reading a function's __code__ (the read is itself audited)

    def hidden_code(value):
        """Whether ``value`` is a function of the hidden tests (its code holds this runner's constants)."""
        if id(value) in protected_ids:
            return True
        if type_(value) is not FunctionType:
            return False
        thread = get_ident()
        reading.add(thread)
        try:
            return id(value.__code__) in my_codes
        finally:
            reading.discard(thread)

    def hook(event, args):
        if not armed[0]:
            return
        if (window[0] and get_ident() == driver_ident[0]) or (reading and get_ident() in reading):
            return
        if event == "object.__getattr__":
            attribute = args[1]
            if attribute in frame_attributes:
                deny(None, f"reading {attribute}", AttributeError)
            if attribute in code_attributes and hidden_code(args[0]):
                deny("reads-hidden-tests", f"reading {attribute} of hidden test {getattr(args[0], '__qualname__', '?')}")
        elif event == "object.__setattr__":
            if args[1] in code_attributes and hidden_code(args[0]):
                deny("runner-tampering", f"rewriting {args[1]} of hidden test {getattr(args[0], '__qualname__', '?')}")
        elif event == "open":
            target = proc_target(args[0])
            if target is not None:
                deny("runner-tampering" if target.endswith(("/mem", "/maps", "/pagemap")) else None,
                     f"opening {target}")
            mode = args[1] if type_(args[1]) is str_ else ""
            writing = "w" in mode or "a" in mode or "x" in mode or "+" in mode or (type_(args[2]) is int and args[2] & 3)
            path = as_path(args[0]) if writing else None
            if path is not None and startswith(realpath(path) + "/", hidden_dirs):
                deny("test-edits", f"writing {path} while graded")
        elif event == "sys._getframe":
            raise ValueError("relayrl grader: frames are not available while an answer is graded")
        elif event in introspection:
            deny("runner-tampering", f"{event} (introspection of the test runner)")
        elif event.startswith("ctypes."):
            deny("runner-tampering", f"{event} (native memory access)")
        elif event == "import":
            module = args[0]
            filename = args[1] if len_(args) > 1 else None
            if module in forbidden_modules:
                deny("runner-tampering", f"importing {module}", ImportError)
            if type_(filename) is str_ and filename.endswith(".so") and not filename.startswith(system_dirs):
                deny("runner-tampering", f"loading native module {filename}", ImportError)
        elif event == "os.exec":
            if getpid() == pid:
                deny("runner-tampering", f"exec of {args[0]!r} in place of the test runner")
        elif event in ("os.kill", "os.killpg"):
            target = args[0]
            if target in (pid, 0, -1) or (event == "os.killpg" and target == getpgid(pid)):
                deny("runner-tampering", f"{event}({target}) of the test runner")
        elif event == "signal.pthread_kill":
            deny("runner-tampering", "signal.pthread_kill of a runner thread")
        elif event in network:
            note("network", f"{event} {short(args[1:])}")

    # ------------------------------------------------------------------ the driver thread
    driver_ident = [None]
    done = _thread.allocate_lock()
    done.acquire()
    snapshot_modules = [builtins, *infrastructure, re]
    structural = (FunctionType, type, types.ModuleType, types.BuiltinFunctionType)

    def snapshot(test_modules):
        """Identity of what the tests and this runner rely on, to tell what answer code replaced."""
        items = [(f"{module.__name__}.", vars(module), dict(vars(module)), module in test_modules)
                 for module in (*snapshot_modules, *test_modules)]
        items += [(f"{cls.__qualname__}.", cls.__dict__, created, False) for cls, created in class_created.items()]
        items.append(("unittest.TestCase.", TestCase.__dict__, testcase_members, False))
        return items

    def changes(snap):
        found = []
        for label, live, before, lenient in snap:
            for name, value in before.items():
                if name in ("__warningregistry__", "_filters_version"):
                    continue
                current = live.get(name, changes)
                if current is value:
                    continue
                # A test module's setUpModule may rebind its data; its functions and classes stay.
                if lenient and not (isinstance(value, structural) or isinstance(current, structural)):
                    continue
                found.append(f"{label}{name} replaced")
            if not lenient and len_(live) != len_(before):
                found.append(f"{label.rstrip('.')}: names added")
        return found

    def describe(error):
        try:
            text = f"{type_(error).__name__}: {error}"
        except BaseException:  # an answer's exception may not even print
            text = f"{type_(error).__name__}"
        return text if type_(text) is str_ else "<exception>"

    def drain_flags():
        while flags:
            detector, evidence = flags.pop(0)
            emit("flag", detector, evidence)

    # ------------------------------------------------------------------ private copies of the tests
    def rebuild(function, private):
        """``function`` again, with ``private`` as its globals (hidden-test code only)."""
        window[0] = True
        try:
            code, defaults, kwdefaults = function.__code__, function.__defaults__, function.__kwdefaults__
        finally:
            window[0] = False
        if id(code) not in my_codes:
            return function
        copy = FunctionType(code, private, function.__name__, defaults, function.__closure__)
        copy.__kwdefaults__ = kwdefaults
        copy.__qualname__ = function.__qualname__
        copy.__dict__.update(function.__dict__)  # __unittest_skip__ and friends
        protect(copy)
        return copy

    def privatize(value, private):
        kind = type_(value)
        if kind is FunctionType:
            return rebuild(value, private)
        if kind in (staticmethod, classmethod) and type_(value.__func__) is FunctionType:
            return kind(rebuild(value.__func__, private))
        if kind is property:
            return property(*(rebuild(part, private) if type_(part) is FunctionType else part
                              for part in (value.fget, value.fset, value.fdel)), value.__doc__)
        return value

    def private_namespace(module):
        """The module's globals copied, its hidden functions (module level and in its classes) rebuilt on them.

        The copy is referenced only from here: answer code that reaches the module's classes and
        their functions' ``__globals__`` changes the public namespace, which the tests no longer use.
        """
        private = dict(vars(module))
        for name, value in list(private.items()):
            private[name] = privatize(value, private)
        for cls, members in class_members.items():
            if cls.__module__ == module.__name__:
                for name, value in list(members.items()):
                    members[name] = privatize(value, private)
        return private

    prepared = {}  # id of a module namespace, or a class -> None (ready) or why it could not be set up
    teardowns = []

    def prepare_once(owner, setup, teardown, what):
        if owner in prepared:
            return prepared[owner]
        try:
            if setup is not None:
                setup()
            prepared[owner] = None
            if teardown is not None:
                teardowns.append(teardown)
        except BaseException as error:  # SystemExit and KeyboardInterrupt fail the tests too
            prepared[owner] = f"{what} failed: {describe(error)}"
        return prepared[owner]

    def hidden_function(value):
        return type_(value) is FunctionType and id(code_of(value)) in my_codes

    def outcome_of(call):
        try:
            call()
        except unittest.SkipTest as error:
            return "skipped", describe(error)
        except Unverifiable as error:
            return "failed", f"unverifiable: {error}"
        except AssertionError as error:
            return "failed", describe(error)
        except BaseException as error:  # SystemExit and KeyboardInterrupt fail the test too
            return "error", describe(error)
        return "passed", ""

    def run_one(test_id, loaded):
        namespace = None
        parts = test_id.split(".")
        for cut in range(len_(parts) - 1, 0, -1):
            candidate = ".".join(parts[:cut])
            if candidate in loaded:
                namespace, rest = loaded[candidate], parts[cut:]
                break
        if namespace is None:
            return "missing", "its module did not load"
        problem = prepare_once(id(namespace), namespace.get("setUpModule"), namespace.get("tearDownModule"),
                               "setUpModule")
        if problem:
            return "error", problem
        if len_(rest) == 1:
            function = namespace.get(rest[0])
            if not hidden_function(function):
                return "missing", "no such test function in the hidden tests"
            return outcome_of(function)
        if len_(rest) != 2:
            return "missing", "not a test id of the form module.Class.test"
        cls = namespace.get(rest[0])
        if type_(cls) is not type or cls not in class_mro:
            return "missing", "no such test class in the hidden tests"
        function = class_lookup(cls, rest[1])
        if not hidden_function(function):
            return "missing", "no such test method in the hidden tests"
        is_unittest = issubclass(cls, TestCase)
        if getattr(function, "__unittest_skip__", False) or class_lookup(cls, "__unittest_skip__") is True:
            return "skipped", "marked skip"
        if getattr(function, "__unittest_expecting_failure__", False):
            return "failed", "an expected failure is no evidence of a fix"
        if is_unittest:
            problem = prepare_once(cls, class_attr(cls, "setUpClass"), class_attr(cls, "tearDownClass"), "setUpClass")
            if problem:
                return "error", problem
        instance = object_new(cls)
        if is_unittest:  # what TestCase.__init__ sets, without running anything the answer could replace
            instance_dict_of(instance).update({
                "_testMethodName": rest[1], "_outcome": None, "_testMethodDoc": function.__doc__, "_cleanups": [],
                "_subtest": None, "_type_equality_funcs": {}})

        def run():
            setup = class_lookup(cls, "setUp" if is_unittest else "setup_method")
            if setup is not missing:
                get_attr(instance, "setUp")() if is_unittest else get_attr(instance, "setup_method")(function)
            try:
                function(instance)
            finally:
                if is_unittest:
                    get_attr(instance, "tearDown")()
                    testcase_members["doCleanups"](instance)

        return outcome_of(run)

    def driver():
        driver_ident[0] = get_ident()
        status = 3
        try:
            emit("start", PROTOCOL, ",".join(protections), sys.version.split()[0], str_(len_(inventory)))
            # After the standard library (an answer's re.py or math.py must not shadow it), before
            # site-packages (the repository's own packages win over installed ones of the same name).
            site = [index for index, entry in enumerate(sys.path) if "-packages" in entry]
            sys.path.insert(site[0] if site else len_(sys.path), root)
            os.chdir(root)
            loaded = {}
            test_modules = []
            before_answer = snapshot(())  # builtins and unittest before the first answer import
            for name, relative, code, error in modules:
                if code is None:
                    emit("load-error", name, error)
                    continue
                try:
                    package = name.rpartition(".")[0]
                    if package:
                        try:  # noqa: SIM105 - no contextlib here: its module globals are the answer's to patch
                            __import__(package)
                        except ImportError:
                            pass
                    module = types.ModuleType(name)
                    module.__file__ = os.path.join(root, relative)
                    module.__package__ = package
                    module.__builtins__ = dict(pristine_builtins)  # __build_class__, __import__: not the answer's
                    exec(code, module.__dict__)  # the hidden tests, compiled above
                    for value in list(module.__dict__.values()):
                        protect(value)
                    loaded[name] = private_namespace(module)
                except BaseException as error:  # an answer breaking the import fails that module's tests
                    emit("load-error", name, describe(error))
                    continue
                test_modules.append(module)
            tampered = changes(before_answer)
            if tampered:
                note("runner-tampering", "answer code replaced test-runner state while the tests were imported: "
                     + "; ".join(tampered[:3]))
            drain_flags()
            snap = snapshot(test_modules)
            for test_id in inventory:
                outcome, detail = run_one(test_id, loaded)
                tampered = changes(snap)
                if tampered:
                    note("runner-tampering", "answer code replaced test-runner state: " + "; ".join(tampered[:3]))
                    snap = snapshot(test_modules)
                    if outcome == "passed":
                        outcome, detail = "failed", "test-runner state was replaced during the test"
                drain_flags()
                emit("result", test_id, outcome, detail[:500])
            for teardown in reversed(teardowns):
                try:  # noqa: SIM105 - see above
                    teardown()
                except BaseException:  # the verdict is in; clean-up failures do not change it
                    pass
            drain_flags()
            emit("end", str_(len_(inventory)))
            status = 0
        except BaseException as error:  # a runner crash is reported, never a pass
            try:  # noqa: SIM105 - see above
                emit("crash", describe(error))
            except BaseException:  # nothing left to report with
                pass
        finally:
            exit_now(status)

    sys.addaudithook(hook)
    armed[0] = True
    _thread.start_new_thread(driver, ())
    return done


if __name__ == "__main__":
    import builtins as _builtins

    # Run main() in a namespace of its own with a private copy of the builtins, so that nothing the
    # answer patches into ``builtins`` or ``sys.modules["__main__"]`` changes the runner's code.
    _namespace = {"__builtins__": dict(_builtins.__dict__), "__name__": "relayrl_grading_runner",
                  "RECORD_PREFIX": RECORD_PREFIX, "PROTOCOL": PROTOCOL}
    with open(__file__, encoding="utf-8") as _handle:
        exec(compile(_handle.read(), __file__, "exec"), _namespace)  # this very file
    _done = _namespace.pop("main")()
    del _namespace
    _done.acquire()  # the driver thread ends the process with os._exit
