"""The C <-> Python layouts the BPF programs and their Python packers share (issue 44): each pair below is
checked by the compiler, not by eye. A struct's members are laid out by gcc (offsetof/sizeof of the struct
as bpf/*.c declares it) and compared with the struct.Struct that packs or reads it; an enum's values are
compared with the Python names kept for them. A field added, widened or moved on one side only fails here
(the "keep in sync" comments said so and nothing checked it)."""
from __future__ import annotations

import re
import struct
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from optrace.bpf import images, pythonmaps, stackcopies, unwindmaps
from support import REPO

TYPES = "typedef unsigned long long u64; typedef unsigned int u32; typedef unsigned short u16; " \
        "typedef unsigned char u8; typedef int s32;\n#define TASK_COMM_LEN 16\n"


@dataclass(frozen=True)
class Pair:
    source: str  # the C file, in bpf/
    struct_name: str
    packer: struct.Struct


PAIRS = (
    Pair("python_walk.h", "py_proc", pythonmaps.PY_PROC),
    Pair("unwind.c", "unwind_mapping", unwindmaps._MAPPING),
    Pair("stackcopy.c", "copy_head", stackcopies.HEAD),
    Pair("images.c", "image_file", images._FILE),
)
ENUMS = (
    ("python_walk.h", "python_status", pythonmaps.PYTHON_STATUSES),
    ("unwind.c", "unwind_status", unwindmaps.UNWIND_STATUSES),
    ("unwind.c", "unwind_counter", unwindmaps.UNWIND_COUNTERS),
)


def c_body(source: str, kind: str, name: str) -> str:
    text = (REPO / "bpf" / source).read_text()
    match = re.search(rf"^{kind} {name} {{\n(.*?)^}};", text, re.S | re.M)
    assert match, f"no {kind} {name} in bpf/{source}"
    return re.sub(r"//[^\n]*", "", match.group(1))


def members(body: str) -> list[tuple[str, bool]]:
    """(name, whether an array) of each member declared."""
    found = []
    for declaration in body.split(";"):
        words = declaration.split(None, 1)
        if len(words) < 2:
            continue
        for part in words[1].split(","):
            match = re.fullmatch(r"\s*(\w+)\s*(\[\w+\])?\s*", part)
            assert match, f"not a plain member: {declaration.strip()}"
            found.append((match.group(1), match.group(2) is not None))
    return found


def c_layout(pair: Pair) -> tuple[int, list[tuple[int, int]], list[tuple[int, int]]]:
    """(sizeof, [(offset, size) of each member but pads], [the pads']) as gcc lays the struct out; an array of
    bytes is one field, another array one field per element."""
    body = c_body(pair.source, "struct", pair.struct_name)
    prints = " ".join(f'printf("%zu %zu %zu\\n", offsetof(struct s, {name}), sizeof(((struct s *)0)->{name}), '
                      f'(size_t){f"sizeof(((struct s *)0)->{name}[0])" if array else "0"});'
                      for name, array in members(body))
    program = (f"#include <stdio.h>\n#include <stddef.h>\n{TYPES}struct s {{\n{body}}};\n"
               f'int main(void) {{ printf("%zu\\n", sizeof(struct s)); {prints} return 0; }}\n')
    with tempfile.TemporaryDirectory() as folder:
        exe = Path(folder) / "layout"
        built = subprocess.run(["gcc", "-x", "c", "-o", str(exe), "-"], input=program, capture_output=True, text=True)
        assert built.returncode == 0, built.stderr
        lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    fields, pads = [], []
    for (name, _), at in zip(members(body), range(1, len(lines), 3)):
        offset, size, element = map(int, lines[at:at + 3])
        if name.startswith("pad"):
            pads.append((offset, size))
        elif element in (0, 1):  # a scalar, or bytes: one field
            fields.append((offset, size))
        else:
            fields.extend((offset + i * element, element) for i in range(size // element))
    return int(lines[0]), fields, pads


def packed_layout(packer: struct.Struct) -> tuple[int, list[tuple[int, int]]]:
    """(size, [(offset, size) of each field but pad bytes]) of a struct.Struct."""
    fields, offset = [], 0
    prefix = packer.format[0] if packer.format[0] in "<>=!@" else ""
    for count, code in re.findall(r"(\d*)([a-zA-Z?])", packer.format.lstrip("<>=!@")):
        count = int(count or 1)
        if code == "x":
            offset += count
        elif code == "s":
            fields.append((offset, count))
            offset += count
        else:
            size = struct.calcsize(prefix + code)
            fields.extend((offset + i * size, size) for i in range(count))
            offset += size * count
    return packer.size, fields


@pytest.mark.parametrize("pair", PAIRS, ids=lambda pair: pair.struct_name)
def test_a_struct_and_its_packer_agree(pair):
    assert agree(pair), f"struct {pair.struct_name} (bpf/{pair.source}): {c_layout(pair)} != {packed_layout(pair.packer)}"


def agree(pair: Pair) -> bool:
    """Same size, same fields; a C pad may be skipped or read by the packer."""
    size, fields, pads = c_layout(pair)
    packed_size, packed = packed_layout(pair.packer)
    in_pad = [(offset, width) for offset, width in packed
              if any(start <= offset and offset + width <= start + length for start, length in pads)]
    return size == packed_size and fields == [field for field in packed if field not in in_pad]


@pytest.mark.parametrize("source,name,names", ENUMS, ids=lambda value: value if isinstance(value, str) else "")
def test_an_enum_and_its_names_agree(source, name, names):
    values = [member.split("=")[0].strip() for member in c_body(source, "enum", name).split(",")
              if member.strip() and "_NR_" not in member]  # a count of the values is not one
    assert len(values) == len(names), f"enum {name} (bpf/{source}) has {values}, Python names {names}"


def test_the_check_fails_on_a_moved_field():
    """A packer one field off (py_proc's last u32 packed as a u16) is told apart."""
    moved = Pair("python_walk.h", "py_proc", struct.Struct(pythonmaps.PY_PROC.format.replace("2xI", "2xH2x")))
    assert not agree(moved)
