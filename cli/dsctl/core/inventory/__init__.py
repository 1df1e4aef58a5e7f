"""The inventory as a whole (pure): its schema, which joins each host's fleet settings (dsctl.core.fleet) with its
services and NPU network (dsctl.core.serving, dsctl.core.network) and checks the fleet at once, and the plans made
from the validated fleet: per host for the plays (host_plan, which the filter plugins compute too) and what a
deploy changes (deploy_plan).  It sits above those packages: none of them imports it."""
