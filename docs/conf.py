"""Sphinx configuration for the trio_supervise docs."""

from __future__ import annotations

import trio_supervise

project = "trio_supervise"
author = "trio_supervise developers"
copyright = "2026, trio_supervise developers"
release = trio_supervise.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "README.md"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}


html_theme = "furo"
html_title = "trio_supervise"
