"""python -m metamem: the command line for transformers and timm models (metamem.cli)."""

import gc
import sys

from .cli import main

status = main()
# The process ends here: what it holds is frozen, so that the interpreter's
# last collection does not walk it (after a trace of torchtitan's 405B, 2 s
# of the command's 15).
gc.freeze()
sys.exit(status)
