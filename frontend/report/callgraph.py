"""Merge a Record's stacks into a call tree: the model of `report -G`, the flame graphs and `diff`'s.

In *caller* order a path runs from the outermost frame (``main``) to the leaf, as ``perf report -g
caller`` and flame graphs draw it; in *callee* order from the leaf out to its callers (perf's default
``-g callee``: who called the hot function). A node's ``total`` is the samples whose stack runs through
that path, its ``self`` those that end there. Percentages are of all samples in the record, as in the
report rows, so a node's total equals that function's ``--children`` count wherever the function does
not call itself.

Stacks are selected as ``--format folded`` selects them: ``--pid``/``--comm`` by the sample,
``--dso`` by the leaf frame. ``-s`` does not apply: a tree node is always one (object, symbol).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from optrace.errors import OptraceError
from optrace.frontend.report.framenames import frame_label
from optrace.frontend.report.rows import (
    UNKNOWN_FRAME,
    ReportOptions,
    dso_selected,
    sample_total,
    selected_samples,
)
from optrace.heap import gc_paused
from optrace.model import JIT_MAP, UNKNOWN, Frame, Record

ROOT_NAME = "all"


def frame_kind(frame: Frame) -> str:
    """How a flame graph colours a frame: kernel, jit (perf maps, jitdumps), runtime (a runtime's own frames,
    frontend/runtimes/), unknown or user."""
    if frame.kernel:
        return "kernel"
    if frame.runtime:
        return "runtime"
    if frame.kind == JIT_MAP or frame.dso.startswith("[jit]"):
        return "jit"
    if frame.symbol == UNKNOWN:
        return "unknown"
    return "user"


@dataclass(slots=True)
class Node:
    """One path prefix of the tree; ``kind`` is a :func:`frame_kind`, "comm" or "root"."""

    symbol: str
    dso: str
    kind: str
    total: int = 0
    self_count: int = 0
    children: dict[int, Node] = field(default_factory=dict)  # by the child's key id

    def sorted_children(self) -> list[Node]:
        """Largest first, ties by name: the order every output prints."""
        return sorted(self.children.values(), key=lambda node: (-node.total, node.symbol, node.dso))


@dataclass
class CallTree:
    root: Node
    order: str
    total_samples: int  # all samples in the record: the base of every percentage
    stacks: bool  # False for a record made with --no-stacks (leaf frames only)


class _Keys:
    """(dso, symbol, kind) -> a small int, so millions of child lookups hash ints, not tuples."""

    def __init__(self) -> None:
        self.ids: dict[tuple[str, str, str], int] = {}
        self.values: list[tuple[str, str, str]] = []

    def __call__(self, dso: str, symbol: str, kind: str) -> int:
        key = (dso, symbol, kind)
        found = self.ids.get(key)
        if found is None:
            found = self.ids[key] = len(self.values)
            self.values.append(key)
        return found


def build_tree(record: Record, options: ReportOptions, order: str = "caller", by_comm: bool = False) -> CallTree:
    """The merged tree of the selected stacks. With ``by_comm`` the first level under the root is the
    command name (as the folded format and flamegraph.pl put it)."""
    with gc_paused():
        return _build_tree(record, options, order, by_comm)


def _build_tree(record: Record, options: ReportOptions, order: str, by_comm: bool) -> CallTree:
    keys = _Keys()
    frame_ids = [keys(frame.dso, frame_label(frame), frame_kind(frame)) for frame in record.frames]
    selected = [dso_selected(frame, options.dsos) for frame in record.frames]
    unknown_id = keys(UNKNOWN_FRAME.dso, UNKNOWN_FRAME.symbol, frame_kind(UNKNOWN_FRAME))
    unknown_selected = dso_selected(UNKNOWN_FRAME, options.dsos)
    root = Node(ROOT_NAME, "", "root")
    comms: dict[str, Node] = {}
    values = keys.values
    for sample in selected_samples(record, options):
        frames = sample.frames
        if not (selected[frames[0]] if frames else unknown_selected):
            continue
        path = [frame_ids[i] for i in frames] if frames else [unknown_id]
        if order == "caller":
            path.reverse()
        node = _comm_node(root, comms, sample.comm) if by_comm else root
        count = sample.count
        node.total += count
        for key_id in path:
            children = node.children
            child = children.get(key_id)
            if child is None:
                dso, symbol, kind = values[key_id]
                child = children[key_id] = Node(symbol, dso, kind)
            child.total += count
            node = child
        node.self_count += count
    root.total = sum(child.total for child in root.children.values())
    return CallTree(root=root, order=order, total_samples=sample_total(record), stacks=record.meta.stacks)


def _comm_node(root: Node, comms: dict[str, Node], comm: str) -> Node:
    node = comms.get(comm)
    if node is None:
        node = comms[comm] = root.children[-1 - len(comms)] = Node(comm, "", "comm")
    return node


def require_stacks(record: Record, what: str) -> None:
    """A call graph or flame graph of nothing, or of leaf frames only, would mislead: say so instead."""
    if not record.samples or sample_total(record) == 0:
        raise OptraceError(f"the record has no samples: there is no {what} to draw")
    if not record.meta.stacks:
        raise OptraceError(f"the record was made with --no-stacks (leaf frames only): a {what} needs stacks;"
                           " record again without --no-stacks")


def walk(root: Node) -> list[tuple[int, Node]]:
    """(depth, node) in preorder, children largest first; the root is depth 0. Iterative: a hostile
    record's stacks are bounded by the kernel's 127 frames, but a comm level and kernel frames add up."""
    with gc_paused():
        return _walk(root)


def _walk(root: Node) -> list[tuple[int, Node]]:
    out: list[tuple[int, Node]] = []
    pending = [(0, root)]
    pop, push, append = pending.pop, pending.extend, out.append
    while pending:
        depth, node = pop()
        append((depth, node))
        children = node.children
        if len(children) == 1:
            pending.append((depth + 1, next(iter(children.values()))))
        elif children:
            push((depth + 1, child) for child in reversed(node.sorted_children()))
    return out
