//! Client side of `shard_directory`: routing application work to the shard the directory names.
