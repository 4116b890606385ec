from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from optrace.frontend.symbols.demangle import _cached_demangle, demangle


def test_cplusplus() -> None:
    assert demangle("_ZN4demo6Hasher3mixEd") == "demo::Hasher::mix(double)"
    assert demangle("_ZL3foov.isra.0") == "foo() [clone .isra.0]"


def test_plain_and_invalid_names_unchanged() -> None:
    for name in ("main", "hot_a.cold", "_Zfoo", "_R", "_RNvXs_", "_ZN3foo", ""):
        assert demangle(name) == name


def test_rust_legacy_hash_dropped_and_escapes_decoded() -> None:
    assert demangle("_ZN3std2rt10lang_start17h0123456789abcdefE") == "std::rt::lang_start"
    name = "_$LT$alloc..vec..Vec$LT$T$C$A$GT$$u20$as$u20$core..ops..drop..Drop$GT$"
    assert demangle(f"_ZN{len(name)}{name}4drop17h1e2f3a4b5c6d7e8fE") == "<alloc::vec::Vec<T,A> as core::ops::drop::Drop>::drop"
    closure = "_ZN4core3ptr85drop_in_place$LT$std..rt..lang_start$LT$$LP$$RP$$GT$..$u7b$$u7b$closure$u7d$$u7d$$GT$17h0123456789abcdefE"
    assert demangle(closure) == "core::ptr::drop_in_place<std::rt::lang_start<()>::{{closure}}>"


def test_rust_v0() -> None:
    assert demangle("_RNvCs6GmmlP4bgsG_1r4main") == "r::main"
    assert demangle("_RNvMNtCs6GmmlP4bgsG_1r5innerNtB2_1S2go") == "<r::inner::S>::go"
    assert demangle("_RNCNvNtCs6GmmlP4bgsG_1r5inner4work0B5_") == "r::inner::work::{closure#0}"
    assert demangle("_RINvNtCs1234_3std3mem4swapReEB6_") == "std::mem::swap::<&str>"


@pytest.mark.root  # the toolchain is root's (~/.cargo)
def test_rust_v0_from_rustc(tmp_path: Path) -> None:
    """Names rustc itself produced, read back by nm: every main-crate function demangles."""
    (tmp_path / "r.rs").write_text(
        "mod inner { pub struct S; impl S { #[inline(never)] pub fn go(&self, x: u64) -> u64 { x * 3 } } }\n"
        "fn main() { println!(\"{}\", inner::S.go(std::env::args().count() as u64)); }\n")
    subprocess.run(["rustc", "-O", "-C", "symbol-mangling-version=v0", "-o", str(tmp_path / "r"), str(tmp_path / "r.rs")],
                   check=True, capture_output=True)
    names = [line.split()[-1] for line in subprocess.run(["nm", str(tmp_path / "r")], capture_output=True, text=True,
                                                         check=True).stdout.splitlines()]
    ours = {demangle(name) for name in names if name.startswith("_R") and "1r" in name}
    assert {"r::main", "<r::inner::S>::go"} <= ours


@given(st.text(max_size=40).map(lambda tail: "_R" + tail) | st.text(max_size=40).map(lambda t: "_ZN" + t)
       | st.text(max_size=40))
def test_never_raises(name: str) -> None:
    assert isinstance(demangle(name), str)


def test_rust_v0_backref_bomb_is_shown_as_is_at_once() -> None:
    """Each layer is a tuple of two backrefs to the layer before: 22 layers (208 characters) expanded
    to 4 million pairs and took minutes with the GIL held; now the name is shown unchanged."""
    text = "IC1f"
    layer = len(text)
    text += "a"
    for _ in range(22):
        ref = "B" + base62(layer)
        layer = len(text)
        text += "T" + ref + ref + "E"
    name = "_R" + text + "E"
    started = time.monotonic()
    assert demangle(name) == name
    assert time.monotonic() - started < 0.5


def base62(value: int) -> str:
    """The v0 encoding of a backref position (RFC 2603: "_" is 0, else value - 1 in base 62, then "_")."""
    if value == 0:
        return "_"
    digits, value = "", value - 1
    while True:
        digits = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"[value % 62] + digits
        value //= 62
        if value == 0:
            return digits + "_"


def test_long_names_are_cut_and_not_cached() -> None:
    """A file's names are any user's: a readable name is at most 4096 characters, and only short
    names stay in the cache."""
    long_name = "_Z1fI" + "".join(f"N{i}A{i}E" for i in range(2000)) + "Ev"
    readable = demangle(long_name)
    assert len(readable) == 4096 and readable.endswith("...")
    before = _cached_demangle.cache_info().currsize
    for index in range(50):
        demangle(f"_Z{600 + index}{'x' * (600 + index)}v")
    assert _cached_demangle.cache_info().currsize == before
