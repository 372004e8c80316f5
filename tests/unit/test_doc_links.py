"""The documentation holds together: every relative link in README.md and docs/
points to a file that exists (and, for `page.md#anchor`, to a heading of that
page), the README stays a ten-minute read, and every docs page is one click
from the README.

No training and no imports of the package: the pages are read as text."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
MAX_README_LINES = 250

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.M)
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def pages() -> list[Path]:
    return [README, *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "docs").glob("*/*.md"))]


def prose(text: str) -> str:
    """The text without code: a link shown in a code block or inline code is no link."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def links(page: Path) -> list[str]:
    text = prose(page.read_text())
    return LINK.findall(text) + REFERENCE.findall(text)


def is_external(target: str) -> bool:
    return re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) is not None  # http:, mailto:, ...


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, code marks and punctuation
    dropped, lower case, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def resolve(page: Path, target: str) -> tuple[Path, str]:
    path, _, anchor = unquote(target).partition("#")
    return (page if not path else (page.parent / path).resolve()), anchor


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in links(page):
        if is_external(target):
            continue
        path, anchor = resolve(page, target)
        try:
            rel = path.relative_to(REPO).as_posix()
        except ValueError:
            broken.append(f"{target} (outside the repository)")
            continue
        if not path.exists():
            broken.append(f"{target} (no such file: {rel})")
            continue
        if anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target} (no heading '#{anchor}' in {rel})")
    return broken


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_point_to_existing_files(page: Path) -> None:
    assert broken_links(page) == []


def test_readme_is_a_ten_minute_read() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; at most {MAX_README_LINES}"


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = set()
    for target in links(README):
        if not is_external(target):
            path, _ = resolve(README, target)
            linked.add(path)
    missing = [
        p.relative_to(REPO).as_posix()
        for p in sorted((REPO / "docs").glob("*.md"))
        if p.resolve() not in linked
    ]
    assert missing == [], f"docs pages the README does not link: {missing}"


def test_the_checks_see_what_they_check() -> None:
    """The link finder finds links (not those shown as code), and the slugs are
    GitHub's, so the tests above do not pass by finding nothing."""
    assert len(links(README)) > 20
    assert (
        slug("§12 Phases: one recipe for the whole run") == "12-phases-one-recipe-for-the-whole-run"
    )
    assert slug("The vision-language model (`vlm`)") == "the-vision-language-model-vlm"
    assert links_in("see [a](x.md) and `[b](y.md)`") == ["x.md"]


def links_in(text: str) -> list[str]:
    return LINK.findall(prose(text))
