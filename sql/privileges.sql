-- Who may run what. Trigger functions are attached by the extension alone; the DBA's functions
-- are granted by the extension's owner (README: "Roles and grants"). Functions that write the
-- extension's own tables do so as the owner of those tables, so a grant of EXECUTE is enough.
REVOKE EXECUTE ON FUNCTION
    shard_directory_statement_begin(),
    shard_directory_guard(),
    shard_directory_record_history(),
    notify_directory_change(),
    shard_directory_refuse_truncate(),
    shard_directory_version_guard(),
    shard_directory_history_guard(),
    shards_guard(),
    shard_moves_notify(),
    shard_settings_guard(),
    shard_fences_changed(),
    shard_directory_protect_statement(),
    shard_directory_protect_row(),
    raise_min_accepted(bigint),
    fence_owned(text, text, bigint),
    fence_frozen(text, text),
    fence_frozen(text, text, interval, bigint),
    fence_cutover(text, text, interval, bigint),
    fence_moved(text, text, text, bigint),
    unfence(text, text),
    protect(regclass),
    protect(regclass, text, text),
    unprotect(regclass),
    purge_history(timestamptz),
    release_expired_freeze(text, text),
    bypass_fence(text, text),
    advance_sequence(regclass, bigint),
    changes_since(bigint, integer),
    stats(),
    entity_stats(integer)
FROM PUBLIC;
-- The check's counts name the busiest entities and their rates: for monitoring roles.
GRANT EXECUTE ON FUNCTION stats(), entity_stats(integer) TO pg_monitor;
