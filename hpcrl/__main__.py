import sys

from hpcrl.runtime import collector

collector.pause()  # until the command's start-up is over (runtime/collector.py)
from hpcrl.cli import main  # noqa: E402

sys.exit(main())
