"""``python -m microgpt_xp.bench``."""

import sys

from . import main

sys.exit(main())
