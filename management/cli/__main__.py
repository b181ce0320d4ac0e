import sys

from management.cli.main import main

sys.exit(main())
