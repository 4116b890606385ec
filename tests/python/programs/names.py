"""Code objects with names of every str kind (ASCII, latin-1, UCS-2, UCS-4), a 300-character name and a
non-BMP file name; prints one JSON line describing them, then waits to be read."""
import json
import sys
import time


def plain():
    return 1


def café():
    return 2


def функция():
    return 3


def 𠀀𠀁():
    return 4


class Outer:
    def method(self):
        return 5


space = {}
exec(compile("\n\ndef " + "n" * 300 + "():\n    return 6\n", "fichier_𝔣é.py", "exec"), space)
functions = [plain, café, функция, 𠀀𠀁, Outer.method, space["n" * 300]]
described = {}
for function in functions:
    code = function.__code__
    described[code.co_name] = {"address": id(code), "name": code.co_name,
                               "qualname": getattr(code, "co_qualname", code.co_name),
                               "filename": code.co_filename, "firstlineno": code.co_firstlineno}
print(json.dumps(described), flush=True)
time.sleep(120)
