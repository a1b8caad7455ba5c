"""Neutralize a markdown report before it is posted as a pull-request comment.

    python3 verify_attn_tools/sanitize.py < report.md > safe.md

Standard library only: the commenting job runs it with any python3, nothing installed. The
report quotes what results files hold (implementation names, case labels, reasons), and a
results file can come from a pull request. In the comment, such text must not:

* mention anyone: ``@user`` and ``@org/team`` get a zero-width joiner after the ``@``, which
  GitHub's mention filter does not match (the text reads the same);
* hide the rest of the comment or inject markup: every ``<`` becomes ``&lt;`` (an HTML
  comment ``<!--``, a raw tag, an autolink ``<http://..>``), except the few bare tags the
  reports themselves use to fold rows (``<details>``, ``<summary>``, ``<sub>``, ``<br>``, no
  attributes);
* link or load anything: ``[`` and ``]`` become ``&#91;`` and ``&#93;`` (no markdown link,
  image or reference definition can form), and an HTML entity other than the few escapes
  used here has its ``&`` escaped (``&#64;user`` would otherwise be a mention again once
  rendered).

Tables, bold text, arrows and numbers are left as they are. ``cell(text)`` is the stricter
escape report and ab apply to each value from a results file they put in a table cell.
"""

from __future__ import annotations

import re
import sys

ZWJ = "\u200d"
# The bare tags a report may use itself (folded rows, the exit line).
ALLOWED_TAGS = re.compile(r"</?(?:details|summary|sub|sup|b|br|p)\s*/?>", re.IGNORECASE)
# Escapes this module writes; any other entity (&#64;, &commat;, &#x5b;) loses its meaning.
SAFE_ENTITIES = re.compile(r"&(?:lt|gt|amp|quot|#91|#93|#124|#96|#42|#92|#95|#33);")
ENTITY = re.compile(r"&(?:#[0-9]+|#[xX][0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);")
MENTION = re.compile(r"@(?=[A-Za-z0-9])")


def _entities(text: str) -> str:
    return ENTITY.sub(lambda m: m[0] if SAFE_ENTITIES.fullmatch(m[0]) else "&amp;" + m[0][1:], text)


def _tags(text: str) -> str:
    out, pos = [], 0
    for m in re.finditer("<", text):
        allowed = ALLOWED_TAGS.match(text, m.start())
        out.append(text[pos:m.start()])
        if allowed:
            out.append(allowed[0])
            pos = allowed.end()
        else:
            out.append("&lt;")
            pos = m.end()
    out.append(text[pos:])
    # ALLOWED_TAGS consumed whole tags; an unmatched "<" left inside one cannot occur.
    return "".join(out)


def sanitize(text: str) -> str:
    """The whole comment, neutralized (idempotent: sanitizing twice changes nothing more)."""
    text = _entities(text)
    text = _tags(text)
    text = text.replace("[", "&#91;").replace("]", "&#93;")
    return MENTION.sub("@" + ZWJ, text)


CELL = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "[": "&#91;", "]": "&#93;", "|": "&#124;", "`": "&#96;",
        "*": "&#42;", "\\": "&#92;", "\r": " ", "\n": " "}


def cell(value) -> str:
    """A value from a results file (a name, a label, a reason) as inert text for a markdown table
    cell or a line: no markup, no link, no mention, no line break, no column break. A plain
    name (letters, digits, spaces and ``_.,:;=()/+-%``) comes out unchanged."""
    text = str(value)
    if re.fullmatch(r"[\w .,:;=()/+\-%]*", text):
        return text
    text = "".join(CELL.get(ch, ch) for ch in text)
    return MENTION.sub("@" + ZWJ, text)


def main() -> int:
    sys.stdout.write(sanitize(sys.stdin.read()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
