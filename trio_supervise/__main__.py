"""``python -m trio_supervise``: the same as the ``trio-supervise`` command."""

import sys

from ._cli import main

sys.exit(main())
