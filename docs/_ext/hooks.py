"""mkdocs hooks for the docs build (mkdocs.yml: ``hooks: [docs/_ext/hooks.py]``).

``mkdocs build --strict`` fails on every warning, griffe's docstring warnings included. Two
conventions of stoker's ``Args:`` sections are not Google style and make griffe warn, though the
page renders them well (one table row for the group):

- several parameters described together: ``train_batch_size / eval_batch_size / ...:`` or
  ``num_shards, shard_index:``;
- a closing catch-all row: ``Others: as image_folder``.

Those warnings are logged at DEBUG here (``mkdocs build --verbose`` lists them). Every other
griffe warning, e.g. a parameter that the signature does not have, still fails the build.

The changelog page: ``docs/changelog.md`` is a pointer to ``CHANGELOG.md`` for readers of the
repository (GitHub renders it); on the site the page shows ``CHANGELOG.md`` itself, its
``docs/...`` links made relative to the page. A snippet
include (``--8<--``) would do the same on the site but show its raw include line on GitHub.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

GRIFFE_LOGGER = "mkdocs.plugins.griffe"
ARGS_WARNING = re.compile(
    r"(?:No type or annotation for parameter|Parameter) '(?P<name>[^']+)'"
    r"(?: does not appear in the function signature)?$"
)
CATCH_ALL = {"Others", "Other arguments", "Others arguments"}


def _is_convention(message: str) -> bool:
    match = ARGS_WARNING.search(message)
    if match is None:
        return False
    name = match["name"]
    return " / " in name or ", " in name or name in CATCH_ALL


class _Demote(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and _is_convention(record.getMessage()):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger("mkdocs").isEnabledFor(logging.DEBUG)  # shown with --verbose only
        return True


_FILTER = _Demote()


def on_startup(command: str, dirty: bool) -> None:  # noqa: ARG001 - the mkdocs hook signature
    logger = logging.getLogger(GRIFFE_LOGGER)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)


CHANGELOG = Path(__file__).resolve().parents[2] / "CHANGELOG.md"


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:  # noqa: ARG001 - the mkdocs hook signature
    """The site's changelog page is the repository's ``CHANGELOG.md``."""
    if page.file.src_uri == "changelog.md":
        # CHANGELOG.md links pages as GitHub sees them from the root (docs/x.md); the site's
        # changelog page sits beside them (x.md)
        return re.sub(r"\]\(docs/", "](", CHANGELOG.read_text(encoding="utf-8"))
    return markdown
