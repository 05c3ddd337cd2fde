"""The read model of the `jobs` table: every read of it outside the executor's store, as named queries
returning typed rows (the executor's store is the one writer of job state and keeps its own reads).

Each function is one SQL statement, so a caller pays the round trips it paid with the SQL inline, and
takes a pool or a connection (a read inside the caller's transaction). A read confined to a team takes
the team and filters in SQL: the api's authorization and redaction rest on those filters.

- `one_job`: one job by its id (its row, its team, its log cursor, its trace).
- `team_jobs`: reads confined to one team (a page of jobs, a chain, a reference, quota usage, the ids
  and names redaction keeps).
- `cluster_jobs`: reads across teams (who holds which devices, the pending queue, the metrics).
- `rule_rows`: the columns the decider's rules read.
"""
