"""Entry point of `python -m torchtitan.components.checkpoint verify PATH`."""

import sys

from torchtitan.components.checkpoint.verify import main

sys.exit(main())
