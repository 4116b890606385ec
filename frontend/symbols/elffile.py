"""pyelftools' ELFFile made cheap for what the symbolizer reads: a few sections by name or type, and
the program headers.

To find a section by name, pyelftools first builds every section object of the file, which parses
its hash tables and dynamic section: 5 ms for libc, 50 ms for libLLVM, each time an object is loaded.
Here only the section headers are parsed until a section is asked for (about 1 ms). This overrides
a private helper of pyelftools 0.32, pinned in pyproject.toml; tests/symbols cover every use.
"""
from __future__ import annotations

from collections.abc import Iterator

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import Section


class ElfFile(ELFFile):
    def _make_section_name_map(self) -> None:
        """As pyelftools' own (the last section of a name wins), from the section headers alone."""
        self._section_name_map = {}
        for index in range(self.num_sections()):
            header = self._get_section_header(index)
            if header is not None:
                self._section_name_map[self._get_section_name(header)] = index

    def sections_of_type(self, section_type: str) -> Iterator[Section]:
        """The sections whose sh_type is ``section_type`` (e.g. "SHT_DYNAMIC"); only those are built."""
        for index in range(self.num_sections()):
            header = self._get_section_header(index)
            if header is not None and header["sh_type"] == section_type:
                yield self.get_section(index)

    def segment_headers(self) -> Iterator:
        """The program headers (``p_type``, ``p_offset``...), without building segment objects."""
        for index in range(self.num_segments()):
            yield self._get_segment_header(index)
