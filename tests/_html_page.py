"""One parse of an HTML page for the report tests: its tags with their attributes, its text."""

from __future__ import annotations

from html.parser import HTMLParser


class Page(HTMLParser):
    """Tags (with attributes) and the text of a page, from one parse."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def find(self, tag: str, **attrs: str) -> list[dict[str, str]]:
        return [
            a
            for t, a in self.tags
            if t == tag and all(a.get(k.rstrip("_")) == v for k, v in attrs.items())
        ]


def parse_page(text: str) -> Page:
    page = Page()
    page.feed(text)
    return page
