"""Run the zephon demo: ``python -m zephon``."""
import sys

from zephon.cli import main

sys.exit(main())
