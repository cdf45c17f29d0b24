import sys

from gpuhpc.cli.main import main

sys.exit(main())
