"""``python -m store``: the operator's command line (see :mod:`store.cli`)."""

import sys

from .cli import main

sys.exit(main())
