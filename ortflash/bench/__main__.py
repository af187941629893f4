"""``python -m ortflash.bench``: the same as ``ortflash bench``."""

import sys

from .cli import main

sys.exit(main())
