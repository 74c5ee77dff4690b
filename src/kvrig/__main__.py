import sys

from kvrig.cli import main

sys.exit(main())
