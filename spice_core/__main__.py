import sys

from spice_core.cli import main

sys.exit(main())
