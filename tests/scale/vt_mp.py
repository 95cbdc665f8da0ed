"""`python -m vt ...` preceded by vt.distributed.initialize(): how each process of launch/local.sh starts the
CLI until vt/cli.py makes that call itself (initialize() is idempotent, so this stays correct afterwards)."""
import sys

from vt.distributed import initialize

initialize()

from vt.cli import main  # noqa: E402

sys.exit(main())
