import sys

from spice_core.tools.cli import main

sys.exit(main())
