import sys

from bagpipe.cli import main

sys.exit(main())
