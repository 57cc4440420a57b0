"""``python -m gpuledger``: the same as the ``gpuledger`` command."""

import sys

from gpuledger.cli import main

sys.exit(main())
