from accelmon.cli import main

raise SystemExit(main())
