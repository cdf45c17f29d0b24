import sys

from gpuhpc.cli import entry

sys.exit(entry())
