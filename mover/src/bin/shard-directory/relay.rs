//! `relay`: runs the relay (crate `shard-directory-relay`) until the process is stopped.

use std::path::PathBuf;
use std::time::Duration;

use shard_directory_mover::with_password;
use shard_directory_relay::RelayOptions;

use crate::output::Outcome;

#[derive(clap::Args)]
pub struct RelayArgs {
    /// The Redis to publish to: redis://[user:password@]host:port/db, a user allowed to
    /// PUBLISH on the channel.
    #[arg(long, env = "SHARD_DIRECTORY_RELAY_REDIS")]
    redis: String,
    /// The pub/sub channel (the clients' RelayConfig::channel).
    #[arg(long, default_value = "shard_directory")]
    channel: String,
    /// A file holding the key the messages are sealed with (without a trailing newline; the
    /// clients' RelayConfig::key).
    #[arg(long)]
    key_file: PathBuf,
    /// How often the relay reads and publishes the version when nothing is notified (the
    /// clients take the relay for gone after a few missed).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    heartbeat: Duration,
}

pub async fn relay(directory: tokio_postgres::Config, args: RelayArgs) -> Result<(), Outcome> {
    let RelayArgs {
        redis,
        channel,
        key_file,
        heartbeat,
    } = args;
    let key = std::fs::read(&key_file)
        .map_err(|e| Outcome::Usage(format!("--key-file {}: {e}", key_file.display())))?;
    let key = key.strip_suffix(b"\n").unwrap_or(&key).to_vec();
    if key.is_empty() {
        return Err(Outcome::Usage(format!(
            "--key-file {}: the file is empty",
            key_file.display()
        )));
    }
    let options = RelayOptions {
        redis,
        channel,
        key,
        heartbeat,
    };
    shard_directory_relay::relay(&with_password(directory), &options)
        .await
        .map_err(|e| Outcome::Usage(format!("--redis: {e}")))
}
