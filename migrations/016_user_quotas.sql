-- Per-user limits beside the team's (a user is a token name, jobs.owner): devices and jobs one user of
-- the team may hold at once. NULL = no per-user limit.
ALTER TABLE quotas ADD COLUMN IF NOT EXISTS max_gpus_per_user integer CHECK (max_gpus_per_user >= 0);
ALTER TABLE quotas ADD COLUMN IF NOT EXISTS max_running_jobs_per_user integer CHECK (max_running_jobs_per_user >= 0);
