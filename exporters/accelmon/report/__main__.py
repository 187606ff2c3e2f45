import sys

from accelmon.report.cli import main

sys.exit(main())
