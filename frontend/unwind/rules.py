"""Run an FDE's call-frame program and keep, per PC, the three rules a stack walker needs: the CFA, the
caller's rbp and the return address (which must be at CFA - 8).

A program is interpreted once per (CIE, program bytes): compilers emit the same few prologue/epilogue
shapes over and over (in gcc's cc1 most of its 45,201 FDEs repeat an earlier one), so
:class:`ProgramRunner` memoizes the resulting rows as offsets from the FDE's start.
"""
from __future__ import annotations

from optrace.frontend.unwind.cfi import MAX_INSTRUCTIONS, MAX_STATE_DEPTH, Cie, CfiError, plt_threshold, sleb128, uleb128
from optrace.frontend.unwind.row import (CFA_PLT, CFA_RBP, CFA_RSP, CFA_UNSUPPORTED, OUTERMOST, RBP_AT_CFA, RBP_SAME,
                                         RBP_UNSUPPORTED, S16, S32, UNSUPPORTED, Rule)

REG_RBP, REG_RSP, REG_RA = 6, 7, 16
PLT_EXPAND = 0xFF  # internal cfa_type: a PLT expression with another threshold (rbp_offset holds it)
PLT_THRESHOLD = 11

# The CFA: (register, offset) or ("plt", N, K) or ("expr",)
_EXPR = ("expr",)
# rbp: None (same value) or an int (saved at CFA + n) or "?" (unsupported); ra: "ok", "undefined", "other"
_RBP_SAME, _RBP_OTHER = None, "?"
_RA_OK, _RA_UNDEFINED, _RA_OTHER = "ok", "undefined", "other"

State = tuple  # (cfa, rbp, ra)
Rows = list[tuple[int, Rule]]  # (byte offset from the FDE's start, rule), the first at 0


class ProgramRunner:
    """Rows of FDE programs, memoized per (CIE, program)."""

    def __init__(self) -> None:
        self._programs: dict[tuple[int, bytes], Rows] = {}
        self._initial: dict[int, State] = {}
        self._rules: dict[State, Rule] = {}

    def rows(self, cie: Cie, program: bytes) -> Rows:
        """Raises CfiError when the program is malformed."""
        key = (cie.offset, program)
        rows = self._programs.get(key)
        if rows is None:
            initial = self._initial.get(cie.offset)
            if initial is None:
                initial = self._initial[cie.offset] = _run(cie, cie.initial, (_EXPR, _RBP_SAME, _RA_OTHER), None)[1]
            rows = self._programs[key] = [(loc, self._rule(state)) for loc, state in _run(cie, program, initial, initial)[0]]
        return rows

    def _rule(self, state: State) -> Rule:
        rule = self._rules.get(state)
        if rule is None:
            rule = self._rules[state] = to_rule(state)
        return rule


def to_rule(state: State) -> Rule:
    cfa, rbp, ra = state
    if ra == _RA_UNDEFINED:
        return OUTERMOST
    if ra != _RA_OK:
        return UNSUPPORTED
    if len(cfa) == 3:  # the PLT expression
        offset, threshold = cfa[1], cfa[2]
        return Rule(CFA_PLT, offset, RBP_SAME, 0) if threshold == PLT_THRESHOLD else Rule(PLT_EXPAND, offset, RBP_SAME, threshold)
    if len(cfa) != 2 or cfa[0] not in (REG_RSP, REG_RBP) or not S32[0] <= cfa[1] <= S32[1]:
        return UNSUPPORTED
    cfa_type = CFA_RSP if cfa[0] == REG_RSP else CFA_RBP
    if rbp is _RBP_SAME:
        return Rule(cfa_type, cfa[1], RBP_SAME, 0)
    if rbp == _RBP_OTHER or not S16[0] <= rbp <= S16[1]:
        return Rule(cfa_type, cfa[1], RBP_UNSUPPORTED, 0)
    return Rule(cfa_type, cfa[1], RBP_AT_CFA, rbp)


def _run(cie: Cie, code: bytes, state: State, initial: State | None) -> tuple[list[tuple[int, State]], State]:
    """Interpret ``code`` from ``state``: (rows as (location, state) at each advance and at the end, final
    state). ``initial`` is the CIE's state, for DW_CFA_restore (None while running the CIE itself).

    One loop with the frequent instructions inline (advance_loc, offset, restore, def_cfa_offset...) and
    the rest in :func:`_rare`: this loop is most of a table's build time."""
    cfa, rbp, ra = state
    ra_col = cie.ra_register
    code_align, data_align = cie.code_align, cie.data_align
    stack: list[State] = []
    rows: list[tuple[int, State]] = []
    loc = pos = 0
    end = len(code)
    if end > MAX_INSTRUCTIONS * 16:
        raise CfiError(f"call-frame program of {end} bytes")
    count = 0
    while pos < end:
        count += 1
        if count > MAX_INSTRUCTIONS:
            raise CfiError(f"more than {MAX_INSTRUCTIONS} call-frame instructions")
        op = code[pos]
        pos += 1
        high = op & 0xC0
        if high == 0x40:  # DW_CFA_advance_loc
            rows.append((loc, (cfa, rbp, ra)))
            loc += (op & 0x3F) * code_align
            continue
        if high == 0x80:  # DW_CFA_offset (rbx, r12-r15... are skipped: the walker follows rbp only)
            reg = op & 0x3F
            if pos < end and code[pos] < 0x80:  # one-byte ULEB128: nearly always
                value, pos = code[pos], pos + 1
            else:
                value, pos = uleb128(code, pos, end)
            if reg == REG_RBP or reg == ra_col:
                rbp, ra = _saved(reg, value * data_align, rbp, ra, ra_col)
            continue
        if high == 0xC0:  # DW_CFA_restore
            rbp, ra = _restore(op & 0x3F, rbp, ra, ra_col, initial)
            continue
        if op == 0x0E:  # def_cfa_offset
            if pos < end and code[pos] < 0x80:
                value, pos = code[pos], pos + 1
            else:
                value, pos = uleb128(code, pos, end)
            cfa = (cfa[0], value) if len(cfa) == 2 else _EXPR
        elif op == 0x0C:  # def_cfa
            reg, pos = uleb128(code, pos, end)
            value, pos = uleb128(code, pos, end)
            cfa = (reg, value)
        elif op == 0x0D:  # def_cfa_register
            reg, pos = uleb128(code, pos, end)
            cfa = (reg, cfa[1]) if len(cfa) == 2 else _EXPR
        elif op == 0x0A:  # remember_state
            if len(stack) >= MAX_STATE_DEPTH:
                raise CfiError(f"remember_state nested deeper than {MAX_STATE_DEPTH}")
            stack.append((cfa, rbp, ra))
        elif op == 0x0B:  # restore_state
            if not stack:
                raise CfiError("restore_state without remember_state")
            cfa, rbp, ra = stack.pop()
        elif op in (0x02, 0x03, 0x04):  # advance_loc1/2/4
            size = 1 << (op - 2)
            if pos + size > end:
                raise CfiError("truncated advance_loc")
            rows.append((loc, (cfa, rbp, ra)))
            loc += int.from_bytes(code[pos:pos + size], "little") * code_align
            pos += size
        elif op == 0x00 or op == 0x2E:  # nop, GNU_args_size
            if op == 0x2E:
                _, pos = uleb128(code, pos, end)
        else:
            cfa, rbp, ra, pos = _rare(op, code, pos, end, cie, (cfa, rbp, ra), initial)
    rows.append((loc, (cfa, rbp, ra)))
    return rows, (cfa, rbp, ra)


def _rare(op: int, code: bytes, pos: int, end: int, cie: Cie, state: State, initial: State | None) -> tuple:
    """The instructions seldom seen in compiler output: (cfa, rbp, ra, position after the instruction)."""
    cfa, rbp, ra = state
    ra_col, data_align = cie.ra_register, cie.data_align
    if op in (0x05, 0x11, 0x2F):  # offset_extended, offset_extended_sf, GNU_negative_offset_extended
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
        cfa = ("plt", *plt) if plt else _EXPR
    elif op == 0x12:  # def_cfa_sf
        reg, pos = uleb128(code, pos, end)
        value, pos = sleb128(code, pos, end)
        cfa = (reg, value * data_align)
    elif op == 0x13:  # def_cfa_offset_sf
        value, pos = sleb128(code, pos, end)
        cfa = (cfa[0], value * data_align) if len(cfa) == 2 else _EXPR
    else:  # set_loc (pc-relative, never emitted by gcc or gas), window_save and unknown ones
        raise CfiError(f"call-frame instruction {op:#x} is not supported")
    return cfa, rbp, ra, pos


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
    base_rbp, base_ra = (initial[1], initial[2]) if initial else (_RBP_SAME, _RA_OTHER)
    if reg == REG_RBP:
        return base_rbp, ra
    if reg == ra_col:
        return rbp, base_ra
    return rbp, ra


def _skip_block(code: bytes, pos: int, end: int) -> int:
    size, pos = uleb128(code, pos, end)
    if pos + size > end:
        raise CfiError("expression runs past the call-frame program")
    return pos + size
