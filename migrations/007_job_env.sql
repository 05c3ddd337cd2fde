-- Settings a tune protocol gave a job (e.g. NCCL variables), kept for every later start of it.
ALTER TABLE jobs ADD COLUMN env jsonb NOT NULL DEFAULT '{}';
