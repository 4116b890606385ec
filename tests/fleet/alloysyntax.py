"""A reader for the Alloy configuration syntax (Grafana Alloy's, formerly River), enough to check
docs/fleet/pyroscope.alloy where no Alloy can be installed: blocks (``name "label" { ... }``, dotted names),
attributes (``key = value``), strings, numbers, booleans, null, lists, objects (``{"k" = v, ...}``),
references (``discovery.file.optrace.targets``) and calls (``sys.env("X")``), ``//``, ``#`` and
``/* */`` comments. Anything else is a SyntaxError with its line."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

TOKEN = re.compile(r"""
    (?P<space>\s+|//[^\n]*|\#[^\n]*|/\*.*?\*/)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<number>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
  | (?P<punct>[{}\[\](),=])
""", re.VERBOSE | re.DOTALL)


@dataclass(frozen=True)
class Reference:
    """A reference to another component's export, e.g. ``pyroscope.write.server.receiver``."""
    path: str


@dataclass
class Block:
    name: str
    label: str | None = None
    attributes: dict[str, object] = field(default_factory=dict)
    blocks: list["Block"] = field(default_factory=list)

    def block(self, name: str, label: str | None = None) -> "Block":
        """The one child block called ``name`` (and ``label``)."""
        found = [b for b in self.blocks if b.name == name and (label is None or b.label == label)]
        if len(found) != 1:
            raise KeyError(f"{len(found)} blocks {name} {label or ''} in {self.name}")
        return found[0]


def _tokens(text: str) -> list[tuple[str, str, int]]:
    tokens, pos = [], 0
    while pos < len(text):
        match = TOKEN.match(text, pos)
        if match is None:
            raise SyntaxError(f"line {text.count(chr(10), 0, pos) + 1}: unexpected {text[pos]!r}")
        if match.lastgroup != "space":
            tokens.append((match.lastgroup, match.group(), text.count("\n", 0, pos) + 1))
        pos = match.end()
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.pos = 0

    def peek(self, offset: int = 0) -> tuple[str, str, int]:
        index = self.pos + offset
        return self.tokens[index] if index < len(self.tokens) else ("end", "", self.tokens[-1][2] if self.tokens else 1)

    def take(self, kind: str, value: str | None = None) -> str:
        got_kind, got, line = self.peek()
        if got_kind != kind or (value is not None and got != value):
            raise SyntaxError(f"line {line}: expected {value or kind}, found {got or 'the end'!r}")
        self.pos += 1
        return got

    def closes(self, closing: str | None) -> bool:
        kind, text, _ = self.peek()
        return kind == "end" if closing is None else (kind, text) == ("punct", closing)

    def body(self, into: Block, closing: str | None) -> Block:
        """Attributes and blocks up to ``closing`` (or the end of the file)."""
        while not self.closes(closing):
            name = self.take("name")
            if self.peek()[1] == "=":
                self.take("punct", "=")
                if name in into.attributes:
                    raise SyntaxError(f"line {self.peek()[2]}: {name} set twice")
                into.attributes[name] = self.value()
            else:
                label = json.loads(self.take("string")) if self.peek()[0] == "string" else None
                self.take("punct", "{")
                into.blocks.append(self.body(Block(name, label), "}"))
        if closing is not None:
            self.take("punct", closing)
        return into

    def value(self) -> object:
        kind, text, line = self.peek()
        if kind == "string":
            self.pos += 1
            return json.loads(text)
        if kind == "number":
            self.pos += 1
            return float(text) if any(c in text for c in ".eE") else int(text)
        if text == "[":
            return self.sequence("[", "]", self.value)
        if text == "{":
            return dict(self.sequence("{", "}", self.item))
        if kind == "name":
            self.pos += 1
            if text in ("true", "false", "null"):
                return {"true": True, "false": False, "null": None}[text]
            if self.peek()[1] == "(":
                return (Reference(text), self.sequence("(", ")", self.value))
            return Reference(text)
        raise SyntaxError(f"line {line}: expected a value, found {text or 'the end'!r}")

    def item(self) -> tuple[str, object]:
        key = json.loads(self.take("string")) if self.peek()[0] == "string" else self.take("name")
        self.take("punct", "=")
        return key, self.value()

    def sequence(self, opening: str, closing: str, element) -> list:
        """Comma-separated elements between ``opening`` and ``closing``, a trailing comma allowed."""
        self.take("punct", opening)
        items = []
        while self.peek()[1] != closing:
            items.append(element())
            if self.peek()[1] != closing:
                self.take("punct", ",")
        self.take("punct", closing)
        return items


def parse(text: str) -> Block:
    """The file as one root block holding its components."""
    return _Parser(text).body(Block("<root>"), None)
