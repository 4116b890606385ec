from __future__ import annotations

from optrace.procfs import MapEntry, parse_maps

TEXT = """\
55d0c0a00000-55d0c0a01000 r--p 00000000 fe:00 1234                       /opt/my app/demo
55d0c0a01000-55d0c0a02000 r-xp 00001000 fe:00 1234                       /opt/my app/demo
7f0000000000-7f0000001000 r-xp 00002000 fe:00 99                         /tmp/lib.so (deleted)
7f0000100000-7f0000200000 rwxp 00000000 00:00 0 
7f0000300000-7f0000301000 rwxs 00000000 00:01 77                         /dev/zero (deleted)
7ffd1b1fe000-7ffd1b200000 r-xp 00000000 00:00 0                          [vdso]
"""


def test_parse_maps_paths_with_spaces_deleted_and_anonymous() -> None:
    entries = parse_maps(TEXT)
    assert entries[1] == MapEntry(0x55D0C0A01000, 0x55D0C0A02000, "r-xp", 0x1000, "fe:00", 1234, "/opt/my app/demo")
    assert entries[1].file_offset(0x55D0C0A01010) == 0x1010 and entries[1].executable and entries[1].is_file
    assert entries[2].file_path == "/tmp/lib.so" and entries[2].is_file
    assert entries[3].path == "" and not entries[3].is_file and entries[3].executable
    assert not entries[4].is_file  # shared anonymous memory, not an ELF object
    assert entries[5].path == "[vdso]" and not entries[5].is_file
