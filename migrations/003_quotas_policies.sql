-- Team quotas and the policy document (the strategies part of the config, editable through the API).

CREATE TABLE quotas (
    team               text PRIMARY KEY,
    max_gpus           integer CHECK (max_gpus >= 0),          -- devices in use at once; NULL = no limit
    max_running_jobs   integer CHECK (max_running_jobs >= 0),  -- jobs holding devices at once; NULL = no limit
    allowed_priorities text[],                                 -- NULL = every level
    over_quota         text NOT NULL DEFAULT 'queue' CHECK (over_quota IN ('queue', 'refuse')),
    updated_by         text,
    updated_at         timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE policies (
    version    bigserial PRIMARY KEY,
    body       jsonb NOT NULL,        -- {"strategies": {...}, "controller": {...}} as in adc_config.yaml
    updated_by text NOT NULL,
    reason     text,
    created_at timestamptz NOT NULL DEFAULT now()
);
