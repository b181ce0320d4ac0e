import sys

from management.cli import main

sys.exit(main())
