from xl.cli import main

raise SystemExit(main())
