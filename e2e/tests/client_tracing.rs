//! Tracing of the client, in a test binary of its own: a thread-local
//! subscriber sees every event only when no other test in the process registers callsites
//! concurrently.

use std::time::Duration;

use shard_directory_client::DirectoryConfig;
use shard_directory_e2e::{eventually, reaches, Topology};

const DEADLINE: Duration = Duration::from_secs(15);

/// A routed transaction runs in a `shard_directory.route` span naming the entity, the
/// shard, the attempt and the version; giving up and serving a stale entry are logged.
#[tokio::test]
async fn routed_transactions_carry_a_span_and_giving_up_is_logged() {
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let t = Topology::start("spans").await;
    let v = t.add_tenant("1", "shard_1").await;
    let d = t.client_directory(DirectoryConfig::default()).await;
    reaches(&d, v).await;
    let r = t.router(d.clone());
    let key = shard_directory_client::EntityKey::new("tenant", "1");
    r.run(&key, async |tx| {
        tx.execute(
            "INSERT INTO orders (tenant_id, item) VALUES ('1', 'traced')",
            &[],
        )
        .await?;
        Ok::<_, shard_directory_client::Error>(())
    })
    .await
    .unwrap();
    // A freeze longer than a short deadline: giving up is logged.
    t.step("SELECT shard_directory.freeze('tenant', '1')").await;
    let impatient = t.router(d.clone()).with_retry(
        shard_directory_client::RetryPolicy::default().deadline(Duration::from_millis(100)),
    );
    eventually("the freeze to reach the client", DEADLINE, || async {
        (d.lookup("tenant", "1").await.ok()?.state == shard_directory_client::State::ReadOnly)
            .then_some(())
    })
    .await;
    assert!(impatient
        .run(&key, async |_| Ok::<_, shard_directory_client::Error>(()))
        .await
        .is_err());

    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains(&format!(
            "shard_directory.route{{entity=tenant/1 attempt=1 shard=shard_1 version={v}}}"
        )),
        "{text}"
    );
    assert!(text.contains("shard directory watcher connected"), "{text}");
    assert!(
        text.contains("gave up waiting for a cutover to end"),
        "{text}"
    );
}
