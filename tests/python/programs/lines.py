"""Prints, for code objects of this interpreter, what the interpreter itself says each instruction's line is
(PyCode_Addr2Line, the function behind frame.f_lineno, for every code unit), with the raw line table and
co_firstlineno: one JSON object per line. Runs on 3.8+ (no f-string = debugging, no walrus)."""
import ctypes
import json
import sys
import textwrap
import types

TRICKY = '''
def gaps(x):
    a = 1
''' + "\n" * 300 + '''
    b = 2
    for i in range(3):
        a += i
    return (a,
            b,
            x)


def long_line():
    return [str(i) + str(i * 2) + str(i * 3) for i in range(9)] + [(1, 2, 3, str(4), str(5), str(6), str(7), str(8), str(9), str(10), str(11), str(12), str(13), str(14), str(15), str(16), str(17), str(18), str(19), str(20), str(21), str(22), str(23), str(24), str(25), str(26), str(27), str(28), str(29), str(30), str(31), str(32), str(33), str(34), str(35), str(36), str(37), str(38), str(39), str(40))]


def tries(f):
    try:
        return f()
    except (ValueError, TypeError) as err:
        raise RuntimeError(err) from None
    finally:
        f = None


class Holder:
    @staticmethod
    def nested():
        def inner(y):
            while y:
                y -= 1
            return lambda: y
        return inner
''' + "\n" * 70000 + '''
def far_away():
    return 1
'''


def code_objects(code):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from code_objects(const)


def report(code):
    addr2line = ctypes.pythonapi.PyCode_Addr2Line
    addr2line.argtypes = (ctypes.py_object, ctypes.c_int)
    addr2line.restype = ctypes.c_int
    if sys.version_info >= (3, 10):
        table = code.co_linetable
    else:
        table = code.co_lnotab
    units = len(code.co_code) // 2
    lines = [addr2line(code, unit * 2) for unit in range(units)]
    print(json.dumps({"name": code.co_name, "firstlineno": code.co_firstlineno, "table": table.hex(),
                      "lines": lines}))


for top in (compile(TRICKY, "tricky.py", "exec"), compile(open(textwrap.__file__).read(), textwrap.__file__, "exec")):
    for code in code_objects(top):
        report(code)
