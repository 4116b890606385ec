"""docs/fleet/grafana-dashboard.json read as Grafana reads it, where no Grafana can run: its variables, its
panels' PromQL, and Grafana's interpolation of variables into that PromQL (for a Prometheus data source)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

VARIABLE = re.compile(r"\$\{(\w+)\}|\[\[(\w+)\]\]|\$(\w+)")
REGEX_SPECIAL = re.compile(r"[\\^$.|?*+()\[\]{}]")


@dataclass(frozen=True)
class Query:
    panel: str  # its panel's title
    expr: str
    instant: bool


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def queries(dashboard: dict) -> list[Query]:
    return [Query(panel["title"], target["expr"], bool(target.get("instant")))
            for panel in dashboard["panels"] for target in panel.get("targets", [])]


def variables(dashboard: dict) -> dict[str, dict]:
    return {variable["name"]: variable for variable in dashboard["templating"]["list"]}


def names_used(text: str) -> set[str]:
    return {next(group for group in match.groups() if group) for match in VARIABLE.finditer(text)}


def multi_value(values: list[str]) -> str:
    """Several values of a multi-value variable, as Grafana writes them into a Prometheus regex matcher:
    (a|b), each value's regex characters escaped, the escapes escaped again for the PromQL string."""
    return "(" + "|".join(REGEX_SPECIAL.sub(lambda m: "\\\\" + m.group(), value) for value in values) + ")"


def interpolate(text: str, values: dict[str, str]) -> str:
    """``$name``, ``${name}`` and ``[[name]]`` replaced by their values (a name not given is a KeyError)."""
    return VARIABLE.sub(lambda match: values[next(group for group in match.groups() if group)], text)


def label_values(expression: str) -> tuple[str, str]:
    """(series selector, label) of a variable's ``label_values(SELECTOR, LABEL)`` query."""
    match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", expression.strip())
    assert match, expression
    return match.group(1), match.group(2)
