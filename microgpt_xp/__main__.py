"""``python -m microgpt_xp``: the ``microgpt-xp`` command."""

import sys

from .cli import main

sys.exit(main())
