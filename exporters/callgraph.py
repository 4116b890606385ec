"""`report -G caller|callee` as text: each top-level function, then its call graph drawn as
`perf report --stdio -g` draws it (``---`` starts a chain, ``|--40.00%--`` a branch; percentages of all
samples; a frame that is its parent's only child with all its samples continues the chain unlabelled).
``--percent-limit`` prunes branches below that share. For off-cpu and wall the counts are times."""
from __future__ import annotations

from typing import TextIO

from optrace.exporters.budget import Names, OutputBudget
from optrace.exporters.table import event_lines, filter_text, header_lines, shown_dso
from optrace.frontend.report.callgraph import Node, build_tree, require_stacks
from optrace.frontend.report.events import amount, human_time, is_timed, nothing_line
from optrace.frontend.report.rows import Profile, ReportOptions, percent


def write(stream: TextIO, profile: Profile, options: ReportOptions) -> None:
    record = profile.record
    require_stacks(record, "call graph")
    tree = build_tree(record, options, options.call_graph or "caller")
    graph = _Graph(tree.total_samples, options.percent_limit, tree.order, is_timed(profile.event))
    count = "Time" if graph.timed else "Samples"
    lines = header_lines(record, profile.source, profile.event) + event_lines(profile) + [
        f"# Call graph, {tree.order} order: percentages of all {amount(tree.total_samples, profile.event)}"
        + (f", branches under {options.percent_limit:g}% hidden" if options.percent_limit else ""),
        "#",
        f"# {'Total':>7}  {'Self':>7}  {count:>8}  Shared Object / Symbol",
        "#",
    ]
    for entry in graph.visible(tree.root):
        lines += graph.entry(entry) + [""]
    if not tree.root.children:
        lines.append(f"# {nothing_line(record, profile.event, filter_text(options))}")
    stream.write("\n".join(lines).rstrip("\n") + "\n")


class _Graph:
    def __init__(self, total: int, limit: float, order: str, timed: bool = False) -> None:
        self.total = total
        self.order = order
        self.limit = limit
        self.timed = timed  # the counts are nanoseconds, shown as times
        self.names = Names()
        self.dsos = Names(shown_dso)
        self.budget = OutputBudget()

    def visible(self, node: Node) -> list[Node]:
        return [child for child in node.sorted_children() if self.share(child.total) >= self.limit]

    def share(self, count: int) -> float:
        return percent(count, self.total)

    def name(self, node: Node) -> str:
        return f"{'[k]' if node.kind == 'kernel' else '[.]'} {self.names(node.symbol)}"

    def entry(self, node: Node) -> list[str]:
        """A top-level function's line and graph. Its self samples: in callee order every path starts at
        the leaf, so all of them (a tree node's ``self_count`` counts the stacks that end at its path)."""
        own = node.total if self.order == "callee" else node.self_count
        count = human_time(node.total) if self.timed else str(node.total)
        head = (f"  {self.share(node.total):>6.2f}%  {self.share(own):>6.2f}%  {count:>8}"
                f"  {self.dsos(node.dso)}  {self.name(node)}")
        lines = [head, "            |", "            ---" + self.names(node.symbol)]
        self._below(node, " " * 15, lines)
        return lines

    def _below(self, node: Node, base: str, lines: list[str]) -> None:
        """The chain and branches under ``node``, whose name is printed at column ``len(base)``. A
        stack holds at most a few hundred frames, so the recursion is bounded."""
        children = self.visible(node)
        while len(children) == 1 and children[0].total == node.total:
            node = children[0]
            self._add(lines, base + self.names(node.symbol))
            children = self.visible(node)
        for i, child in enumerate(children):
            last = i == len(children) - 1
            label = f"--{self.share(child.total):.2f}%--"
            self._add(lines, base + "|")
            self._add(lines, base + (" " if last else "|") + label + self.names(child.symbol))
            self._below(child, base + (" " if last else "|") + " " * len(label), lines)

    def _add(self, lines: list[str], line: str) -> None:
        self.budget.take(len(line) + 1)
        lines.append(line)
