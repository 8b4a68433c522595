import sys

from rewrite.cli.main import main

sys.exit(main())
