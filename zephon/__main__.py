"""``python -m zephon``: the ``zephon`` command; with no arguments, its demo."""
import sys

from zephon.cli import main

sys.exit(main(sys.argv[1:] or ["demo"]))
