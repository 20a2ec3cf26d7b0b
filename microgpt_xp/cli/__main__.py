"""``python -m microgpt_xp.cli``: the ``microgpt-xp`` command."""

import sys

from . import main

sys.exit(main())
