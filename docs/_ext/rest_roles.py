"""A griffe extension for the API reference: stoker's docstrings are Google style with reST markup.

mkdocstrings renders docstrings as Markdown, where reST's ``:class:`X``` would show as
":class:" followed by code. This extension rewrites each docstring once the package is loaded:

- ``:class:`X```, ``:func:``, ``:meth:``, ``:mod:``, ``:attr:``, ``:data:``, ``:exc:``,
  ``:obj:`` become optional cross-references: a link where ``X`` (absolute, or relative to the
  object, its class or its module, as Sphinx resolves it) is rendered on some page, plain code
  otherwise, so a reference to an undocumented or external object never fails the strict build;
  ``~`` shows the last component only, as in Sphinx;
- a paragraph ending in ``::`` (a reST literal block) ends in ``:``;
- a reST simple table (``====  ====`` borders) becomes a Markdown table;
- ``docs/<page>.md`` links to that page of the site;
- a name a module imports and lists in ``__all__`` is documented where it is defined, not again
  in every module that re-exports it (each object has one entry, the target of its links).

It only changes what the site shows; the sources are not touched. Loaded from mkdocs.yml
(``extensions: [docs/_ext/rest_roles.py]``); mkdocs does not publish this folder.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):`(?P<target>[^`]+)`")
TABLE_BORDER = re.compile(r"^\s*=+( +=+)+\s*$")
DOCS_PAGE = re.compile(r"(?<![\w/.`])docs/(?P<page>[a-z_]+(?:/[a-z_-]+)?)\.md(?P<anchor>#[\w-]+)?")
DOCS_DIR = Path(__file__).resolve().parents[1]


def _lookup(scope: griffe.Object, path: str) -> str | None:
    """The canonical path of ``path`` seen from ``scope``, or None."""
    try:
        found = scope[path]
    except Exception:  # noqa: BLE001 - griffe raises KeyError, AliasResolutionError, CyclicAliasError
        return None
    try:
        return found.final_target.path if found.is_alias else found.path
    except Exception:  # noqa: BLE001 - an alias to something outside the loaded packages
        return None


def _resolve(obj: griffe.Object, target: str, collection: Any) -> str | None:
    if target.startswith("."):
        target = target.lstrip(".")
    head = target.split(".", 1)[0]
    if head == obj.package.name:
        try:
            found = collection.get_member(target)
        except Exception:  # noqa: BLE001
            found = None
        if found is not None:
            try:
                return found.final_target.path if found.is_alias else found.path
            except Exception:  # noqa: BLE001
                return None
        return None
    scope: griffe.Object | None = obj
    while scope is not None:
        if (path := _lookup(scope, target)) is not None:
            return path
        scope = scope.parent
    return None


def _roles(obj: griffe.Object, text: str, collection: Any) -> str:
    def replace(match: re.Match[str]) -> str:
        raw = match["target"].strip()
        if "<" in raw and raw.endswith(">"):  # :func:`title <target>`
            title, raw = raw[: raw.index("<")].strip(), raw[raw.index("<") + 1 : -1]
        else:
            title = None
        short = raw.startswith("~")
        target = raw.lstrip("~").removesuffix("()")
        shown = title or (target.rsplit(".", 1)[-1] if short else target)
        if match.group(0).startswith((":func:", ":meth:", ":py:func:", ":py:meth:")) and not title:
            shown += "()"
        path = _resolve(obj, target, collection)
        if path is None:
            return f"`{shown}`"
        return f'<autoref identifier="{path}" optional><code>{shown}</code></autoref>'

    return ROLE.sub(replace, text)


def _literal_blocks(text: str) -> str:
    lines = text.split("\n")
    out = []
    for line in lines:
        stripped = line.rstrip()
        if stripped.endswith("::") and not stripped.endswith(":::"):
            stripped = stripped[:-2].rstrip()
            line = stripped + ":" if stripped else ""
        out.append(line)
    return "\n".join(out)


def _table(block: list[str]) -> list[str]:
    """A reST simple table (three borders: top, under the header, bottom) as a Markdown table."""
    border = block[0]
    spans = [(m.start(), m.end()) for m in re.finditer(r"=+", border)]
    rows: list[list[str]] = []
    for line in block[1:-1]:
        if TABLE_BORDER.match(line):
            rows.append([])  # the header's end
            continue
        ends = [start for start, _ in spans[1:]] + [len(line)]
        cells = [line[start:end].strip() for (start, _), end in zip(spans, ends, strict=True)]
        if rows and rows[-1] and not cells[0]:  # a continuation line: its text joins the row above
            rows[-1] = [f"{old} {new}".strip() for old, new in zip(rows[-1], cells, strict=True)]
        else:
            rows.append(cells)
    if [] not in rows:
        return block
    split = rows.index([])
    header, body = rows[:split], rows[split + 1 :]
    head = header[0] if header else [""] * len(spans)
    out = ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(spans)]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in body]
    return out + [""]


def _tables(text: str) -> str:
    lines = text.split("\n")
    out: list[str] = []
    block: list[str] = []
    borders = 0
    for line in lines:
        if borders:
            block.append(line)
            if TABLE_BORDER.match(line):
                borders += 1
                if borders == 3:
                    out += _table(block)
                    block, borders = [], 0
            continue
        if TABLE_BORDER.match(line):
            block, borders = [line], 1
            continue
        out.append(line)
    return "\n".join(out + block)


def _doc_links(text: str) -> str:
    """``docs/checkpoints.md`` -> a link to that page (API pages are all at ``api/<name>/``)."""

    def replace(match: re.Match[str]) -> str:
        if not (DOCS_DIR / f"{match['page']}.md").is_file():
            return match.group(0)
        return f'<a href="../../{match["page"]}/{match["anchor"] or ""}">{match.group(0)}</a>'

    return DOCS_PAGE.sub(replace, text)


def _documented_elsewhere(alias: griffe.Alias) -> bool:
    """Whether ``alias`` points into a public module of the same package (where it is documented)."""
    try:
        target = alias.final_target
    except Exception:  # noqa: BLE001 - unresolvable: outside the loaded packages
        return False
    module = target.module.path
    return module.split(".")[0] == alias.package.name and not any(p.startswith("_") for p in module.split("."))


class RestRoles(griffe.Extension):
    """Rewrite reST roles, literal-block markers and simple tables in every docstring of the package."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        collection = loader.modules_collection
        seen: set[int] = set()

        def visit(obj: griffe.Object) -> None:
            if id(obj) in seen:
                return
            seen.add(id(obj))
            if obj.docstring is not None:
                text = obj.docstring.value
                text = _tables(text)
                text = _literal_blocks(text)
                text = _roles(obj, text, collection)
                text = _doc_links(text)
                obj.docstring.value = text
            for member in obj.members.values():
                if not member.is_alias:
                    visit(member)
                elif obj.is_module and not obj.is_init_module and _documented_elsewhere(member):
                    member.public = False

        visit(pkg)
