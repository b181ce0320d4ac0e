"""``python -m access``: run an Access relay on its own."""

import sys

from access.cli import main

sys.exit(main())
