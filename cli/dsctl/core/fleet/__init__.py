"""What a fleet should run and whether it does: releases matrix, compatibility, versions, the env schema and the
names of the settings, the desired stack and the audit of a host against it.  The schema of a whole inventory, which
joins these with the services, is dsctl.core.inventory (above this package)."""
