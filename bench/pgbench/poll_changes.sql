-- The watcher's read since 0.2.0: the version and what changed since the one before it.
SELECT * FROM shard_directory.changes_since(9);
