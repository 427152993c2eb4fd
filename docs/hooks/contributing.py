"""MkDocs hook: docs/contributing.md shows the repository's CONTRIBUTING.md (which lives at the root, written for
readers of the repository) in place of the marker `<!-- CONTRIBUTING.md -->`. Its headings go one level down (the
page keeps one H1), a link into docs/ becomes a link to that page of the site, and a link to any other file of
the repository becomes the path in code (the site holds only docs/), so the strict build stays free of broken
links whatever CONTRIBUTING.md links to. Web links stay as they are."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

MARKER = "<!-- CONTRIBUTING.md -->"
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)(\s+\"[^\"]*\")?\)")


def _rewrite(text: str, docs: Path) -> str:
    out: list[str] = []
    fence = False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        if not fence and re.match(r"#{1,5} ", line):
            line = "#" + line
        elif not fence:
            line = LINK.sub(lambda m: _link(m, docs), line)
        out.append(line)
    return "\n".join(out) + "\n"


def _link(m: re.Match, docs: Path) -> str:
    bang, label, target, title = m.group(1), m.group(2), m.group(3), m.group(4) or ""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
        return m.group(0)  # a web link, mailto:, or an anchor: unchanged
    path, _, anchor = target.partition("#")
    path = posixpath.normpath(path.lstrip("/"))
    if path.startswith("docs/") and (docs / path[len("docs/"):]).is_file():
        return f"{bang}[{label}]({path[len('docs/'):]}{'#' + anchor if anchor else ''}{title})"
    return f"{label} (`{path}`)" if label and label.strip("`") != path else f"`{path}`"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    docs = Path(config["docs_dir"])
    src = docs.parent / "CONTRIBUTING.md"
    body = (_rewrite(src.read_text(), docs) if src.is_file()
            else "*CONTRIBUTING.md is not in this checkout yet.*\n")
    return markdown.replace(MARKER, body)
