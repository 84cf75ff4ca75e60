"""Every command and code block of the README and of docs/*.md runs (tests/docs.py says how each
kind of block is run and checked): one test a page, and one more, under `-m slow`, for a page
with blocks marked slow, which runs all of them."""

from __future__ import annotations

import pytest

from tests.docs import KINDS, Page, blocks, pages

PAGES = {str(p.name if p.parent.name != "docs" else f"docs/{p.name}"): p for p in pages()}
SLOW = [name for name, page in PAGES.items() if any("slow" in b.flags for b in blocks(page))]


def _run_page(name: str, tmp_path, slow: bool) -> None:
    page = Page(tmp_path)
    for block in blocks(PAGES[name]):
        if slow or "slow" not in block.flags:
            page.run(block)


@pytest.mark.parametrize("name", sorted(PAGES))
def test_page_runs(name, tmp_path):
    _run_page(name, tmp_path, slow=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_page_runs_with_its_slow_blocks(name, tmp_path):
    _run_page(name, tmp_path, slow=True)


def test_every_block_says_what_it_is():
    for page in pages():
        for block in blocks(page):
            assert block.kind in KINDS, f"{block.where}: ```{block.kind}: use one of {KINDS}"


def test_the_pages_have_blocks_of_every_kind():
    kinds = {b.kind for page in pages() for b in blocks(page)}
    assert kinds == set(KINDS)


def test_an_unbalanced_fence_is_not_missed():
    """A fence the parser does not pair (an odd number of ``` lines) would hide a block."""
    for page in pages():
        fences = [
            line
            for line in page.read_text(encoding="utf-8").splitlines()
            if line.lstrip().startswith("```")
        ]
        assert len(fences) == 2 * len(blocks(page)), page.name
