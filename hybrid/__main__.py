"""``python -m hybrid``: the same as the ``hybrid`` console script."""
import sys

from hybrid.cli import main

sys.exit(main())
