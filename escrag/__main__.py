import sys

from escrag.cli import main

sys.exit(main())
