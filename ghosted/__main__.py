import sys

from ghosted.cli import main

sys.exit(main())
