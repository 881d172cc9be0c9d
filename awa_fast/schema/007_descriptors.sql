-- 007: awa's queue and job-kind descriptors (display name, description, owner, docs URL, tags,
-- extra JSON): declared in code before start(), upserted at start and refreshed (last_seen_at)
-- on every presence beat; the leader deletes rows nobody has refreshed for
-- descriptor_retention_days. Limits as awa's (v009).
\ir objects/007_descriptors.sql
