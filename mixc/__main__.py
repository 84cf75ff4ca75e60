from mixc.cli import main

raise SystemExit(main())
