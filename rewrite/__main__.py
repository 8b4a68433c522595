import sys

from rewrite.cli.process import run

sys.exit(run())
