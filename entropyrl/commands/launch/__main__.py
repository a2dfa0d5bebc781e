"""`python -m entropyrl.commands.launch ...`: the same as `entropyrl launch ...`."""

import sys

from entropyrl.commands.launch import main

if __name__ == "__main__":
    sys.exit(main())
