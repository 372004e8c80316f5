import sys

from zephon.tools.cli import main

sys.exit(main())
