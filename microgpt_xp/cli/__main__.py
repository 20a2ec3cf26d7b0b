"""``python -m microgpt_xp.cli``: the ``microgpt-xp`` command (Ctrl-C while it imports
is the same one line and status 130 as later)."""

import sys

try:
    from . import main
except KeyboardInterrupt:
    sys.stderr.write("microgpt-xp: error: interrupted\n")
    sys.exit(130)

sys.exit(main())
