-- Included by migration 007 and by the baseline (ADR 043); part of a released migration:
-- never edited (a later change is a new migration, folded into the baseline).
CREATE TABLE awa_fast.queue_descriptors (
    queue            text PRIMARY KEY CHECK (length(queue) BETWEEN 1 AND 200),
    display_name     text CHECK (length(display_name) <= 200),
    description      text CHECK (length(description) <= 2000),
    owner            text CHECK (length(owner) <= 200),
    docs_url         text CHECK (length(docs_url) <= 2048),
    tags             text[] NOT NULL DEFAULT '{}' CHECK (cardinality(tags) <= 20),
    extra            jsonb NOT NULL DEFAULT '{}',
    descriptor_hash  text NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    last_seen_at     timestamptz NOT NULL DEFAULT now()
);

-- The same shape, keyed by kind (constraints and primary key copied, then renamed with it).
CREATE TABLE awa_fast.job_kind_descriptors (LIKE awa_fast.queue_descriptors INCLUDING ALL);
ALTER TABLE awa_fast.job_kind_descriptors RENAME COLUMN queue TO kind;
