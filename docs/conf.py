"""Sphinx configuration of the zephon docs (Markdown pages through MyST, API from docstrings)."""
import zephon

project = "zephon"
author = "the zephon developers"
copyright = "the zephon developers"
release = version = zephon.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_numpy_docstring = True
napoleon_google_docstring = False

html_theme = "furo"
html_title = f"zephon {release}"
