"""Sphinx extension: read attnlib's docstrings as the plain text they are written in.

attnlib's docstrings are written for `help()` in a notebook, not for reStructuredText, which
autodoc assumes. A few plain-text habits then break the API page under `-W`, or garble it:
`masked_fill_` (a trailing underscore is a link in RST), `*args` (emphasis), `|x|` (a substitution),
a Markdown pipe table, an indented formula followed directly by a less indented line. Before autodoc
parses a docstring, this escapes those characters outside backtick spans, turns pipe tables into
RST list-tables and ends indented blocks with a blank line. Nothing else changes.
"""

from __future__ import annotations

import re

_BACKTICKS = re.compile(r"(``.+?``|`[^`]+`_{0,2})")  # literals and roles: left as they are
_TRAILING_UNDERSCORE = re.compile(r"(?<=\w)(_+)(?![\w])")  # masked_fill_, xavier_normal_'s
_TABLE_ROW = re.compile(r"^\s*\|.*\|\s*$")
_TABLE_RULE = re.compile(r"^\s*\|?[\s:|-]*-{3,}[\s:|-]*\|?\s*$")


def _escape(text: str) -> str:
    """Backslash-escape RST markup characters outside backtick spans."""
    parts = _BACKTICKS.split(text)
    for i in range(0, len(parts), 2):  # even parts are outside backticks
        p = parts[i].replace("\\", "\\\\").replace("*", r"\*").replace("|", r"\|")
        parts[i] = _TRAILING_UNDERSCORE.sub(lambda m: "\\_" * len(m.group(1)), p)
    return "".join(parts)


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def _list_table(rows: list[str], indent: str) -> list[str]:
    """A Markdown pipe table (header, rule, rows) as an RST list-table."""
    out = [f"{indent}.. list-table::", f"{indent}   :header-rows: 1", ""]
    for row in [rows[0]] + rows[2:]:
        for j, cell in enumerate(_cells(row)):
            out.append(f"{indent}   {'* -' if j == 0 else '  -'} {_escape(cell) or '..'}")
    return out + [""]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def plain_to_rst(lines: list[str]) -> list[str]:
    """The docstring's lines, ready for the RST parser (see the module docstring)."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if _TABLE_ROW.match(line) and i + 1 < len(lines) and _TABLE_RULE.match(lines[i + 1]):
            j = i + 2
            while j < len(lines) and _TABLE_ROW.match(lines[j]):
                j += 1
            if out and out[-1].strip():
                out.append("")
            out += _list_table(lines[i:j], " " * _indent(line))
            i = j
            continue
        if line.strip() and out and out[-1].strip() and _indent(line) < _indent(out[-1]):
            out.append("")  # an indented block ends: RST wants a blank line here
        out.append(_escape(line))
        i += 1
    return out


def _process(app, what, name, obj, options, lines: list[str]) -> None:
    if name == "attnlib" or name.startswith("attnlib."):
        lines[:] = plain_to_rst(lines)


def setup(app):
    app.connect("autodoc-process-docstring", _process, priority=400)  # before napoleon (500)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
