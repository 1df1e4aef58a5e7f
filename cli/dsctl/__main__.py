from dsctl.app import main

raise SystemExit(main())
