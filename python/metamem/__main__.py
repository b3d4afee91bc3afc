"""python -m metamem: the command line for transformers and timm models (metamem.cli)."""

import sys

from .cli import main

sys.exit(main())
