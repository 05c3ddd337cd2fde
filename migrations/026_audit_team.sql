-- The team of the job an audit row is about, so a user's view of the log ("my team's events") is one
-- index range, not a join the planner must guess the size of. Written by the audit sink, the only
-- writer of audit rows, as it appends each one (services/audit/sink.py): the team of the row's job, a
-- fact that never changes once the job is stored; for the job.submitted event, which the api publishes
-- before its transaction commits the job, the team the event itself carries. Not in the hash chain:
-- it says who may read a row, not what happened.
ALTER TABLE audit_events ADD COLUMN team text;

-- The rows already there, from the jobs they name (the append-only trigger stands aside for it).
ALTER TABLE audit_events DISABLE TRIGGER audit_events_no_update_delete;
UPDATE audit_events a SET team = j.team FROM jobs j WHERE j.id = a.job_id;
ALTER TABLE audit_events ENABLE TRIGGER audit_events_no_update_delete;

CREATE INDEX audit_events_team_idx ON audit_events (team, id) WHERE team IS NOT NULL;
