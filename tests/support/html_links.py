"""Links of a built report: every href/src of its pages and SVGs, checked to resolve on the
machine (fragments included)."""
from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Links(HTMLParser):
    ATTRS = ("href", "src", "data", "xlink:href", "action")

    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in self.ATTRS and value is not None:
                self.links.append(value)
            if name == "id" and value:
                self.ids.add(value)


def parse(path: Path) -> _Links:
    parser = _Links()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def check_links(report: Path) -> int:
    """Every href/src of every page and SVG of ``report`` resolves (fragments included) and
    none leaves the machine; returns how many were checked."""
    pages = sorted(p for p in report.rglob("*") if p.suffix in (".html", ".svg"))
    assert len(pages) > 20
    parsed = {p: parse(p) for p in pages}
    checked = 0
    for page, links in parsed.items():
        for link in links.links:
            parts = urlsplit(link)
            assert not parts.scheme and not parts.netloc, f"{page}: external link {link}"
            target = page if not parts.path else (page.parent / unquote(parts.path)).resolve()
            assert target.exists(), f"{page.relative_to(report)}: broken link {link}"
            if parts.fragment and target.suffix == ".html":
                ids = parsed[target].ids if target in parsed else parse(target).ids
                assert parts.fragment in ids, f"{page}: no #{parts.fragment} in {target}"
            checked += 1
    return checked
