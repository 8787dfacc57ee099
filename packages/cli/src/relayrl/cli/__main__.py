import sys

from relayrl.cli.main import main

sys.exit(main())
