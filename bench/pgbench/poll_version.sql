-- The watcher's read before 0.2.0: the version row alone.
SELECT version, extract(epoch FROM now() - updated_at)::float8 FROM shard_directory.shard_directory_version;
