"""MkDocs hook: drop Sphinx cross-reference roles from the rendered API reference.

The docstrings name other objects the Sphinx way (``:class:`SolveResult```, ``:func:`solve```),
which mkdocstrings renders as the literal role followed by the name in code. The name in code is
what a reader needs, so the role prefix is removed from the page's HTML. Paragraphs that end
in reStructuredText's "::" keep one colon.
"""
import re

_ROLE = re.compile(r":(?:py:)?(?:class|func|mod|data|meth|attr|exc|obj|const|ref):(?=<code|<a |<span)")


# A paragraph that introduces a literal block the reStructuredText way ends in "::"; the block
# itself renders as code already, so the paragraph keeps one colon, as the reader expects.
_LITERAL_INTRO = re.compile(r"::</p>")


def on_page_content(html, page, config, files):
    return _LITERAL_INTRO.sub(":</p>", _ROLE.sub("", html))
