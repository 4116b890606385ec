"""Run an FDE's call-frame program and keep, per PC, the three rules a stack walker needs: the CFA, the
caller's rbp and the return address (which must be at CFA - 8).

A program is interpreted once per (CIE, program bytes): compilers emit the same few prologue/epilogue
shapes over and over (in gcc's cc1 most of its 45,201 FDEs repeat an earlier one), so
:class:`ProgramRunner` memoizes the resulting rows as offsets from the FDE's start.
"""
from __future__ import annotations

from collections.abc import Iterable, MutableSequence
from dataclasses import dataclass

from optrace.frontend.symbols.cfi import MAX_PROGRAM_BYTES, MAX_STATE_DEPTH, Cie, plt_threshold
from optrace.frontend.symbols.leb128 import DwarfError, sleb128, uleb128
from optrace.frontend.unwind.row import (CFA_PLT, CFA_RBP, CFA_RSP, CFA_UNSUPPORTED, OUTERMOST, RBP_AT_CFA, RBP_SAME,
                                         RBP_UNSUPPORTED, S16, S32, UNSUPPORTED, Rule)

REG_RBP, REG_RSP, REG_RA = 6, 7, 16
PLT_EXPAND = 0xFF  # internal cfa_type: a PLT expression with another threshold (rbp_offset holds it)
PLT_THRESHOLD = 11

# A state is the flat tuple (cfa_register, cfa_offset, plt_threshold, rbp, ra): one tuple per row, no
# nested ones (with nested tuples, python3.11's 5,202 distinct programs took 0.040 s to run, flat 0.022 s).
# cfa_register: a DWARF register, _EXPR (an expression we don't follow) or _PLT (the PLT expression:
# cfa = rsp + cfa_offset + ((pc & 15) >= plt_threshold) * 8); plt_threshold is 0 otherwise.
_EXPR, _PLT = -1, -2
# rbp: None (same value) or an int (saved at CFA + n) or "?" (unsupported); ra: "ok", "undefined", "other"
_RBP_SAME, _RBP_OTHER = None, "?"
_RA_OK, _RA_UNDEFINED, _RA_OTHER = "ok", "undefined", "other"
_START = (_EXPR, 0, 0, _RBP_SAME, _RA_OTHER)  # before a CIE's initial instructions

State = tuple  # (cfa_register, cfa_offset, plt_threshold, rbp, ra)


@dataclass(frozen=True, slots=True)
class Program:
    """An FDE program's rows merged (each offset once, no two consecutive rules alike) as ``offsets`` and
    ``rules``, which the table takes as they are unless ``expand_plt`` (a PLT rule to write out per entry)
    or the FDE overlaps another."""

    offsets: tuple[int, ...]
    rules: tuple[Rule, ...]
    expand_plt: bool

    @classmethod
    def of(cls, rows: Iterable[tuple[int, Rule]]) -> "Program":
        """From (byte offset from the FDE's start, rule) pairs as the program wrote them, the first at 0."""
        offsets: list[int] = []
        rules: list[Rule] = []
        for offset, rule in rows:
            add_row(offsets, rules, offset, rule)
        return cls(tuple(offsets), tuple(rules), any(rule.cfa_type == PLT_EXPAND for rule in rules))


def add_row(positions: MutableSequence[int], rules: list[Rule], at: int, rule: Rule) -> None:
    """Add a row at ``at`` (replacing one already there), merged with an identical previous rule: the one
    way rows are merged, in a program and in a table."""
    if positions and positions[-1] == at:
        positions.pop()
        rules.pop()
    if not rules or rules[-1] != rule:
        positions.append(at)
        rules.append(rule)


class _Rules(dict):
    """State -> Rule, each computed once."""

    def __missing__(self, state: State) -> Rule:
        rule = self[state] = to_rule(state)
        return rule


class ProgramRunner:
    """Rows of FDE programs, memoized per (CIE, program)."""

    def __init__(self) -> None:
        self._programs: dict[tuple[int, bytes], Program] = {}
        self._initial: dict[int, State] = {}
        self._rules = _Rules()

    def rows(self, cie: Cie, program: bytes) -> Program:
        """Raises DwarfError when the program is malformed."""
        key = (cie.offset, program)
        found = self._programs.get(key)
        if found is None:
            initial = self._initial.get(cie.offset)
            if initial is None:
                initial = self._initial[cie.offset] = _run(cie, cie.initial, _START, None)[2]
            locations, states, _ = _run(cie, program, initial, initial)
            found = self._programs[key] = Program.of(zip(locations, map(self._rules.__getitem__, states)))
        return found


UNSUPPORTED_PROGRAM = Program.of([(0, UNSUPPORTED)])


def to_rule(state: State) -> Rule:
    cfa_register, cfa_offset, threshold, rbp, ra = state
    if ra == _RA_UNDEFINED:
        return OUTERMOST
    if ra != _RA_OK:
        return UNSUPPORTED
    if cfa_register == _PLT:
        if threshold == PLT_THRESHOLD:
            return Rule(CFA_PLT, cfa_offset, RBP_SAME, 0)
        return Rule(PLT_EXPAND, cfa_offset, RBP_SAME, threshold)
    if cfa_register not in (REG_RSP, REG_RBP) or not S32[0] <= cfa_offset <= S32[1]:
        return UNSUPPORTED
    cfa_type = CFA_RSP if cfa_register == REG_RSP else CFA_RBP
    if rbp is _RBP_SAME:
        return Rule(cfa_type, cfa_offset, RBP_SAME, 0)
    if rbp == _RBP_OTHER or not S16[0] <= rbp <= S16[1]:
        return Rule(cfa_type, cfa_offset, RBP_UNSUPPORTED, 0)
    return Rule(cfa_type, cfa_offset, RBP_AT_CFA, rbp)


def _run(cie: Cie, code: bytes, state: State, initial: State | None) -> tuple[list[int], list[State], State]:
    """Interpret ``code`` from ``state``: the rows as locations and states (one at each advance and one at
    the end), and the final state. ``initial`` is the CIE's state, for DW_CFA_restore (None while running
    the CIE itself).

    One loop with the frequent instructions inline, most frequent first (def_cfa_offset, advance_loc,
    offset, nop: nine in ten of python3.11's and libc's), and the rest in :func:`_rare`: this loop is most
    of a table's build time. A program is at most MAX_PROGRAM_BYTES long, and every instruction takes a
    byte at least, so the loop needs no count of its own."""
    cfa_register, cfa_offset, threshold, rbp, ra = state
    ra_col = cie.ra_register
    code_align = cie.code_align
    stack: list[State] = []
    locations: list[int] = []
    states: list[State] = []
    loc = pos = 0
    end = len(code)
    if end > MAX_PROGRAM_BYTES:
        raise DwarfError(f"call-frame program of {end} bytes")
    while pos < end:
        op = code[pos]
        pos += 1
        if op == 0x0E:  # def_cfa_offset
            if pos < end and code[pos] < 0x80:  # one-byte ULEB128: nearly always
                cfa_offset = code[pos]
                pos += 1
            else:
                cfa_offset, pos = uleb128(code, pos, end)
            if cfa_register < 0:  # of an expression: still one
                cfa_register, cfa_offset, threshold = _EXPR, 0, 0
            continue
        high = op & 0xC0
        if high == 0x40:  # DW_CFA_advance_loc
            locations.append(loc)
            states.append((cfa_register, cfa_offset, threshold, rbp, ra))
            loc += (op & 0x3F) * code_align
        elif high == 0x80:  # DW_CFA_offset (rbx, r12-r15... are skipped: the walker follows rbp only)
            reg = op & 0x3F
            if pos < end and code[pos] < 0x80:
                value = code[pos]
                pos += 1
            else:
                value, pos = uleb128(code, pos, end)
            if reg == REG_RBP or reg == ra_col:
                rbp, ra = _saved(reg, value * cie.data_align, rbp, ra, ra_col)
        elif op == 0x00:  # nop (the padding after the last instruction)
            pass
        elif high == 0xC0:  # DW_CFA_restore
            rbp, ra = _restore(op & 0x3F, rbp, ra, ra_col, initial)
        elif op == 0x0A:  # remember_state
            if len(stack) >= MAX_STATE_DEPTH:
                raise DwarfError(f"remember_state nested deeper than {MAX_STATE_DEPTH}")
            stack.append((cfa_register, cfa_offset, threshold, rbp, ra))
        elif op == 0x0B:  # restore_state
            if not stack:
                raise DwarfError("restore_state without remember_state")
            cfa_register, cfa_offset, threshold, rbp, ra = stack.pop()
        elif op == 0x02 or op == 0x03 or op == 0x04:  # advance_loc1/2/4
            size = 1 << (op - 2)
            if pos + size > end:
                raise DwarfError("truncated advance_loc")
            locations.append(loc)
            states.append((cfa_register, cfa_offset, threshold, rbp, ra))
            loc += int.from_bytes(code[pos:pos + size], "little") * code_align
            pos += size
        else:
            (cfa_register, cfa_offset, threshold, rbp, ra), pos = _rare(
                op, code, pos, end, cie, (cfa_register, cfa_offset, threshold, rbp, ra), initial)
    final = (cfa_register, cfa_offset, threshold, rbp, ra)
    locations.append(loc)
    states.append(final)
    return locations, states, final


def _rare(op: int, code: bytes, pos: int, end: int, cie: Cie, state: State, initial: State | None) -> tuple[State, int]:
    """The instructions seldom seen in compiler output: (state, position after the instruction)."""
    cfa_register, cfa_offset, threshold, rbp, ra = state
    ra_col, data_align = cie.ra_register, cie.data_align
    if op == 0x0C:  # def_cfa
        cfa_register, pos = uleb128(code, pos, end)
        cfa_offset, pos = uleb128(code, pos, end)
        threshold = 0
    elif op == 0x0D:  # def_cfa_register
        reg, pos = uleb128(code, pos, end)
        cfa_register, cfa_offset, threshold = (reg, cfa_offset, 0) if cfa_register >= 0 else (_EXPR, 0, 0)
    elif op == 0x2E:  # GNU_args_size
        _, pos = uleb128(code, pos, end)
    elif op in (0x05, 0x11, 0x2F):  # offset_extended, offset_extended_sf, GNU_negative_offset_extended
        reg, pos = uleb128(code, pos, end)
        value, pos = (sleb128 if op == 0x11 else uleb128)(code, pos, end)
        rbp, ra = _saved(reg, (-value if op == 0x2F else value) * data_align, rbp, ra, ra_col)
    elif op == 0x06:  # restore_extended
        reg, pos = uleb128(code, pos, end)
        rbp, ra = _restore(reg, rbp, ra, ra_col, initial)
    elif op in (0x07, 0x08):  # undefined, same_value
        reg, pos = uleb128(code, pos, end)
        if reg == REG_RBP:
            rbp = _RBP_SAME  # readelf prints both as "u"; an undefined rbp is never read by a walker that stops
        elif reg == ra_col:
            ra = _RA_UNDEFINED if op == 0x07 else _RA_OTHER
    elif op in (0x09, 0x14, 0x15):  # register, val_offset, val_offset_sf
        reg, pos = uleb128(code, pos, end)
        _, pos = (sleb128 if op == 0x15 else uleb128)(code, pos, end)
        rbp, ra = _other(reg, rbp, ra, ra_col)
    elif op in (0x10, 0x16):  # expression, val_expression
        reg, pos = uleb128(code, pos, end)
        pos = _skip_block(code, pos, end)
        rbp, ra = _other(reg, rbp, ra, ra_col)
    elif op == 0x0F:  # def_cfa_expression
        start = pos
        pos = _skip_block(code, pos, end)
        _, body = uleb128(code, start, end)
        plt = plt_threshold(code[body:pos])
        cfa_register, cfa_offset, threshold = (_PLT, *plt) if plt else (_EXPR, 0, 0)
    elif op == 0x12:  # def_cfa_sf
        cfa_register, pos = uleb128(code, pos, end)
        value, pos = sleb128(code, pos, end)
        cfa_offset, threshold = value * data_align, 0
    elif op == 0x13:  # def_cfa_offset_sf
        value, pos = sleb128(code, pos, end)
        cfa_register, cfa_offset, threshold = (cfa_register, value * data_align, 0) if cfa_register >= 0 else (_EXPR, 0, 0)
    else:  # set_loc (pc-relative, never emitted by gcc or gas), window_save and unknown ones
        raise DwarfError(f"call-frame instruction {op:#x} is not supported")
    return (cfa_register, cfa_offset, threshold, rbp, ra), pos


def _saved(reg: int, offset: int, rbp: object, ra: str, ra_col: int) -> tuple:
    """A register saved at CFA + offset: (rbp, ra)."""
    if reg == REG_RBP:
        return offset, ra
    if reg == ra_col:
        return rbp, (_RA_OK if offset == -8 and ra_col == REG_RA else _RA_OTHER)
    return rbp, ra


def _other(reg: int, rbp: object, ra: str, ra_col: int) -> tuple:
    """A register whose rule we don't follow (another register, an expression, a value)."""
    if reg == REG_RBP:
        return _RBP_OTHER, ra
    if reg == ra_col:
        return rbp, _RA_OTHER
    return rbp, ra


def _restore(reg: int, rbp: object, ra: str, ra_col: int, initial: State | None) -> tuple:
    base_rbp, base_ra = (initial[3], initial[4]) if initial else (_RBP_SAME, _RA_OTHER)
    if reg == REG_RBP:
        return base_rbp, ra
    if reg == ra_col:
        return rbp, base_ra
    return rbp, ra


def _skip_block(code: bytes, pos: int, end: int) -> int:
    size, pos = uleb128(code, pos, end)
    if pos + size > end:
        raise DwarfError("expression runs past the call-frame program")
    return pos + size
