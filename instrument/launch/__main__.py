"""``python -m instrument.launch``: trace-run, as its console script runs it."""
import sys

from . import console

sys.exit(console())
