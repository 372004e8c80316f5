import sys

from zephon.cli import main

sys.exit(main())
