//! A throwaway redis-server on a free loopback port, killed on drop.

use std::process::{Child, Command, Stdio};

use crate::cluster::free_port;

pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    settings: Vec<String>,
}

impl RedisServer {
    pub async fn start() -> RedisServer {
        RedisServer::start_with(&[]).await
    }

    /// With `settings` added to its command line (`--user ...` lines, for ACLs).
    pub async fn start_with(settings: &[&str]) -> RedisServer {
        let settings: Vec<String> = settings.iter().map(|s| s.to_string()).collect();
        let port = free_port();
        RedisServer {
            child: Some(spawn(port, &settings).await),
            port,
            settings,
        }
    }

    /// Kills the server and starts another on the same port, empty: a Redis restart.
    pub async fn restart(&mut self) {
        self.stop();
        self.child = Some(spawn(self.port, &self.settings).await);
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// As user `user` with `password`.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        format!("redis://{user}:{password}@127.0.0.1:{}/", self.port)
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A redis-server on `port`, with `settings`, once it accepts connections.
async fn spawn(port: u16, settings: &[String]) -> Child {
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(settings)
        .stdout(Stdio::null())
        .spawn()
        .expect("start redis-server (scripts/setup.sh installs it)");
    crate::wait::accepting("redis-server", port).await;
    child
}
