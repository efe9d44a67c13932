"""``python -m ibemu.mininet``: the venv side of ``mn --custom`` (see :mod:`ibemu.mininet`)."""

import sys

from ibemu.mininet import main

sys.exit(main())
