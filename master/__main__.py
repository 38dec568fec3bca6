"""python -m master: the same as neuro-master."""

import sys

from master.cli import main

sys.exit(main())
