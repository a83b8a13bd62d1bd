from shardscope.cli import main

raise SystemExit(main())
