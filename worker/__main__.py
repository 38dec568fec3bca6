import sys

from worker.cli import worker_main

sys.exit(worker_main())
