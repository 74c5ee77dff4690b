"""The documentation pages: the site's home is the README (links made relative to docs/),
and every page the README names exists and is in the site's navigation."""

from __future__ import annotations

import re

import yaml

from .builders import ROOT


def test_the_sites_home_is_the_readme() -> None:
    readme = (ROOT / "README.md").read_text().replace("](docs/", "](")
    assert (ROOT / "docs" / "index.md").read_text() == readme, (
        "docs/index.md is out of date with README.md; copy it again with the links made"
        " relative to docs/ (](docs/x.md -> ](x.md)"
    )


def test_every_page_the_readme_names_exists_and_is_in_the_navigation() -> None:
    named = set(re.findall(r"\]\(docs/([\w-]+\.md)", (ROOT / "README.md").read_text()))
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = {next(iter(item.values())) for item in config["nav"]}
    assert named, "the README points at no page"
    for page in named:
        assert (ROOT / "docs" / page).is_file(), page
        assert page in nav, page
    assert config["strict"] is True


def test_the_readme_stays_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) < 200
