from shardscope._src.cli.main import main

raise SystemExit(main())
