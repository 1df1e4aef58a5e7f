"""`dsctl upgrade`, the pure part: the plan (target stacks, batches, refusals), the probe regression gate and the
run state machine with its JSON state file, its key and the unfinished-upgrade refusal. No I/O here:
services/upgrade.py drives the hosts, dsctl.adapters.upgrade_state keeps the state file."""
