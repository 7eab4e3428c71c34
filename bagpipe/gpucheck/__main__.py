from bagpipe.gpucheck.runner import main

raise SystemExit(main())
