import sys

from egressd.cli import main

sys.exit(main())
