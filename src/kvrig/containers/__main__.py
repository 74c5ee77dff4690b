import sys

from kvrig.containers.launch import main

sys.exit(main())
