-- The W3C traceparent of the request that asked for the move (NULL when tracing is off), so the
-- decision the decider makes of it links the request's span (shared/infra/tracing.py). Bounded
-- here as well as checked by its readers: it came with a request.
ALTER TABLE move_requests ADD COLUMN IF NOT EXISTS trace_parent text
    CHECK (trace_parent IS NULL OR length(trace_parent) <= 55);
