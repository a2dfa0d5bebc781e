import sys

from entropyrl.cli import main

sys.exit(main())
