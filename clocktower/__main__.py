import sys

from clocktower.cli import main

sys.exit(main())
