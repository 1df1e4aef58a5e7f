"""What a fleet should run and whether it does: releases matrix, compatibility, versions, inventory and env
schemas, the desired stack and the audit of a host against it."""
