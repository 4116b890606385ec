"""SPEC parsing and symbol -> file offset resolution, checked against nm and real files."""
from __future__ import annotations

import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from optrace.errors import OptraceError
from optrace.frontend.symbols.linker import read_ld_so_cache
from optrace.frontend.uprobes.objects import find_object
from optrace.frontend.uprobes.resolve import resolve_specs
from optrace.frontend.uprobes.spec import parse_spec


def nm_address(path, name: str) -> int:
    out = subprocess.run(["nm", str(path)], capture_output=True, text=True, check=True).stdout
    return next(int(line.split()[0], 16) for line in out.splitlines() if line.split()[-1] == name)


def test_parse_forms():
    assert parse_spec("/bin/bash:main").obj == "/bin/bash"
    assert parse_spec("c:malloc").symbol == "malloc"
    assert parse_spec("c:str*").is_glob and not parse_spec("c:strlen").is_glob
    assert parse_spec("/x:0x1a2B").address == 0x1A2B
    assert parse_spec("libfoo.so:ns::f").symbol == "ns::f"  # split at the first colon only


@given(obj=st.text(min_size=1).filter(lambda t: ":" not in t), target=st.text(min_size=1))
def test_parse_splits_at_the_first_colon(obj, target):
    spec = parse_spec(f"{obj}:{target}")
    assert spec.obj == obj and spec.text == f"{obj}:{target}"
    if spec.address is not None:
        assert int(target, 16) == spec.address and target.lower().startswith("0x")
    else:
        assert spec.symbol == target


@pytest.mark.parametrize("text", ["c", ":malloc", "c:", ""])
def test_parse_rejects_incomplete_specs(text):
    with pytest.raises(OptraceError, match="expected BINARY:SYMBOL"):
        parse_spec(text)


def test_library_names_resolve_like_the_dynamic_linker():
    libc = read_ld_so_cache()["libc.so.6"][0]
    assert find_object("c") == libc
    assert find_object("libc.so.6") == libc
    assert find_object("bash").endswith("/bash")  # not a cached library: a program on PATH


def test_pie_and_non_pie_offsets_follow_program_headers(workloads):
    pie = resolve_specs([f"{workloads}/calls:target"]).probes
    nopie = resolve_specs([f"{workloads}/calls-nopie:target"]).probes
    assert [p.offset for p in pie] == [nm_address(workloads / "calls", "target")]  # text at vaddr == offset
    nopie_vaddr = nm_address(workloads / "calls-nopie", "target")
    assert nopie_vaddr >= 0x400000 and [p.offset for p in nopie] == [nopie_vaddr - 0x400000]


def test_aliases_at_one_address_are_one_probe(workloads):
    probes = resolve_specs([f"{workloads}/calls:target*"]).probes
    assert len(probes) == 1  # both names match: the symbolizer's (perf's) rule picks the longer
    assert probes[0].symbol == "target_alias" and probes[0].aliases == ("target",)
    assert resolve_specs([f"{workloads}/calls:target"]).probes[0].symbol == "target"  # the name asked for
    malloc = resolve_specs(["c:malloc"]).probes
    assert len(malloc) == 1 and malloc[0].symbol == "malloc" and "__libc_malloc" in malloc[0].aliases


def test_ifunc_is_named_and_warned():
    resolution = resolve_specs(["c:strlen"])
    assert resolution.probes[0].symbol == "strlen [ifunc resolver]"
    assert len(resolution.warnings) == 1 and "IFUNC" in resolution.warnings[0]


def test_default_symbol_version_is_chosen():
    """libc has realpath@GLIBC_2.2.5 and realpath@@GLIBC_2.3 at two addresses: probe the default one."""
    libc = find_object("c")
    out = subprocess.run(["nm", "-D", libc], capture_output=True, text=True, check=True).stdout
    default = next(int(line.split()[0], 16) for line in out.splitlines() if line.endswith(" realpath@@GLIBC_2.3"))
    assert [p.offset for p in resolve_specs(["c:realpath"]).probes] == [default]


@pytest.mark.root  # a hard link to a file of root's (fs.protected_hardlinks)
def test_symlink_and_hard_link_give_the_same_key(workloads, calls_links):
    link, hard = calls_links
    keys = {p.key for p in resolve_specs([f"{workloads}/calls:target", f"{link}:target",
                                          f"{hard}:target", f"{workloads}/../build/calls:target"]).probes}
    assert len(keys) == 1


def test_glob_cap_is_configurable():
    with pytest.raises(OptraceError, match=r"matches \d+ functions, more than the limit of 1000"):
        resolve_specs(["c:*"])
    assert len(resolve_specs(["c:*"], max_matches=100000).probes) > 1000
    with pytest.raises(OptraceError, match="limit of 3"):
        resolve_specs(["c:str*"], max_matches=3)


@pytest.mark.parametrize("spec, message", [
    ("c:mallok", r"no function 'mallok' in .*libc\.so\.6: did you mean malloc"),
    ("c:zzzz*", r"no function in .*libc\.so\.6 matches 'zzzz\*'"),
    ("/etc/passwd:main", r"/etc/passwd is not an ELF executable or library"),
    ("/no/such/binary:main", r"no such file: /no/such/binary"),
    ("nosuchlibrary42:f", r"'nosuchlibrary42' is neither a library in the ld.so cache nor a program on PATH"),
    ("c:0x10", r"address 0x10 is not in an executable segment"),
])
def test_bad_specs_raise_clear_errors(spec, message):
    with pytest.raises(OptraceError, match=message):
        resolve_specs([spec])
