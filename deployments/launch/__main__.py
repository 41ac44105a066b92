"""`python -m deployments.launch [CONFIG]`: the launcher (deployments.launch.launcher)."""

import sys

from deployments.launch.launcher import main

sys.exit(main())
