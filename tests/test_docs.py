"""The API reference covers every public module, and the README stays a landing page."""

from __future__ import annotations

import re

from helpers.paths import ROOT


def public_modules() -> set[str]:
    src = ROOT / "src"
    found = set()
    for path in (src / "stoker").rglob("*.py"):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not any(part.startswith("_") for part in parts[1:]):
            found.add(".".join(parts))
    return found


def test_every_public_module_has_a_place_in_the_api_reference():
    pages = "\n".join(p.read_text() for p in (ROOT / "docs" / "api").glob("*.md"))
    referenced = set(re.findall(r"^::: ([\w.]+)", pages, re.MULTILINE))
    assert public_modules() - referenced == set(), "add a `::: module` line to a docs/api page"
    assert referenced - public_modules() == set(), "the API reference names modules that do not exist"


def test_the_readme_is_a_landing_page_whose_links_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "make run" in readme and "make test" in readme
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if "://" not in target:
            assert (ROOT / target).exists(), target
