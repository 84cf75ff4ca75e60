"""The README is a front page: under 200 lines, linking every page of docs/, and its test
command is what CI runs. Its blocks run in tests/test_docs.py."""

from __future__ import annotations

import re

from tests.docs import FENCE
from tests.mixers import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_is_a_front_page():
    assert len(README.splitlines()) < 200


def test_the_readme_links_every_page_of_docs():
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)(?:#[\w-]*)?\)", README))
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages - linked == set(), "pages of docs/ the README does not link"
    assert linked - pages == set(), "links to pages docs/ does not have"


def test_links_between_pages_name_files_that_exist():
    for page in (ROOT / "README.md", *(ROOT / "docs").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.name}: broken link {target}"


def test_ci_runs_the_readme_test_command_verbatim():
    """What a new user is told to run is what CI runs: the block after "Run the tests:" is a
    line of .ci/run, as written."""
    after = README.split("\nRun the tests:\n", 1)[1]
    (command,) = FENCE.search(after)[3].strip().splitlines()
    assert command in (ROOT / ".ci/run").read_text(encoding="utf-8").splitlines()
