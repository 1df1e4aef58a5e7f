"""`dsctl upgrade`, the pure part: the plan (target stacks, batches, refusals), the probe regression gate and the
run state machine with its JSON state file. No I/O here; services/upgrade.py drives the hosts."""
