//! A throwaway redis-server on a free loopback port, killed on drop.

use std::process::{Child, Command, Stdio};

use crate::cluster::free_port;

pub struct RedisServer {
    child: Option<Child>,
    port: u16,
}

impl RedisServer {
    pub async fn start() -> RedisServer {
        RedisServer::start_with(&[]).await
    }

    /// With `settings` added to its command line (`--user ...` lines, for ACLs).
    pub async fn start_with(settings: &[&str]) -> RedisServer {
        let port = free_port();
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
        RedisServer {
            child: Some(child),
            port,
        }
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
