"""``python tools/random_checkpoint ...``: the builder's command line (in the SGLang env)."""

import sys
from pathlib import Path

here = Path(__file__).resolve().parent
# run as a directory: import the package from tools/, not its modules from here
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
sys.path.insert(0, str(here.parent))

from random_checkpoint.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
