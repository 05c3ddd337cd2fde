"""The shapes services agree on: bus messages, actions, statuses, outcomes, subjects, reason codes,
rule configs, metric names. Pure: they import nothing but each other."""
