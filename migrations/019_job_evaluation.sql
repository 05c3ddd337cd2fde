-- The newest metrics of each of LLaMA-Factory's evaluation passes (`evaluated` events), by split:
-- {"eval": {"step": 4, "eval_loss": 1.2, ...}, "predict": {...}}, shown by GET /v1/jobs/{id}.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS evaluation jsonb NOT NULL DEFAULT '{}'::jsonb;
