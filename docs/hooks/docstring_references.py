"""An mkdocs hook: square brackets in a docstring that are not meant as a link are reported, not fatal.

Markdown reads `[title] [identifier]` as a reference link, and mkdocs-autorefs warns when no page
defines the identifier: a docstring formula such as `kmask[b, j] [qc[b,h,i] == kc[b,h,j]]` (outside
backticks) then fails `mkdocs build --strict`, although the page renders the text as written. The
docstrings belong to the package's sources, not to these pages, so such a warning is printed at
INFO level, with its source line, for the source's owner to fix (put the formula in backticks).
Unresolved references written in the pages themselves, and every other warning, still fail the
strict build.
"""

import logging
import re

_AUTOREFS_LOGGER = "mkdocs.plugins.mkdocs_autorefs._internal.plugin"
_FROM_DOCSTRING = re.compile(r"from \S+\.py:\d+: \(.+\) Could not find cross-reference target")


class _DocstringReferencesAsInfo(logging.Filter):
    def filter(self, record):
        if record.levelno == logging.WARNING and _FROM_DOCSTRING.search(record.getMessage()):
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def on_startup(command, dirty):
    logger = logging.getLogger(_AUTOREFS_LOGGER)
    if not any(isinstance(existing, _DocstringReferencesAsInfo) for existing in logger.filters):
        logger.addFilter(_DocstringReferencesAsInfo())
