-- The W3C traceparent of the request that submitted the job (NULL when tracing is off), so
-- every service continues the job's one trace (shared/tracing.py).
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS trace_parent text;
