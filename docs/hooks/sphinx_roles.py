"""MkDocs hook: drop Sphinx cross-reference roles from the rendered API reference.

The docstrings name other objects the Sphinx way (``:class:`SolveResult```, ``:func:`solve```),
which mkdocstrings renders as the literal role followed by the name in code. The name in code is
what a reader needs, so the role prefix is removed from the page's HTML.
"""
import re

_ROLE = re.compile(r":(?:py:)?(?:class|func|mod|data|meth|attr|exc|obj|const|ref):(?=<code|<a |<span)")


def on_page_content(html, page, config, files):
    return _ROLE.sub("", html)
