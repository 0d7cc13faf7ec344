//! Who may use the console, and proof that a form was the console's own.
//!
//! With `--token-file`, every request but the login page and the assets carries a user's token:
//! `Authorization: Bearer <token>` (scripts, Prometheus) or the cookie the login form sets
//! (`HttpOnly`, `SameSite=Strict`, under the base path). The file holds a line `name:token`
//! per user (a line without `name:` is user `console`); the name is who an action is recorded
//! as. Tokens are compared by their HMAC under a key drawn at start, in constant time.
//!
//! Every form that changes something carries a CSRF token (an HMAC of the user's name under
//! that key) and is refused without it, or when its `Origin` is another site's. A form that
//! starts something new (a plan's run) also carries a token good for one use, so that a form
//! sent twice does not start it twice.

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use axum::http::{header, HeaderMap};
use hmac::{KeyInit, Mac};
use sha2::Sha256;

type Hmac = hmac::Hmac<Sha256>;

/// The cookie the login form sets.
pub const COOKIE: &str = "shard_directory_console";

/// The users and the key their tokens are compared under.
pub struct Users {
    key: [u8; 32],
    /// Each user's name and the HMAC of their token.
    users: Vec<(String, Vec<u8>)>,
    /// The number of the next single-use token, and those used.
    issued: AtomicU64,
    used: Mutex<HashSet<u64>>,
}

impl Users {
    /// The users of `path`; an error naming the file and the line when it holds none or a bad
    /// line.
    pub fn load(path: &Path) -> Result<Users, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--token-file {}: {e}", path.display()))?;
        let mut key = [0u8; 32];
        use std::io::Read;
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut key))
            .map_err(|e| format!("a random key (/dev/urandom): {e}"))?;
        let mut users = Users {
            key,
            users: Vec::new(),
            issued: AtomicU64::new(0),
            used: Mutex::new(HashSet::new()),
        };
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, token) = line.split_once(':').unwrap_or(("console", line));
            if name.is_empty() || token.len() < 16 {
                return Err(format!(
                    "--token-file {} line {}: `name:token`, a token of at least 16 characters",
                    path.display(),
                    n + 1
                ));
            }
            let mac = users.mac(token.as_bytes());
            users.users.push((name.to_owned(), mac));
        }
        if users.users.is_empty() {
            return Err(format!("--token-file {}: no user in it", path.display()));
        }
        Ok(users)
    }

    fn mac(&self, data: &[u8]) -> Vec<u8> {
        let mut m = Hmac::new_from_slice(&self.key).expect("any key length");
        m.update(data);
        m.finalize().into_bytes().to_vec()
    }

    /// The user whose token `token` is: its HMAC checked against each user's, in constant
    /// time.
    fn user(&self, token: &str) -> Option<&str> {
        self.users.iter().find_map(|(name, mac)| {
            let mut m = Hmac::new_from_slice(&self.key).expect("any key length");
            m.update(token.as_bytes());
            m.verify_slice(mac).ok().map(|()| name.as_str())
        })
    }

    /// The user a request is from: its bearer token, or its cookie.
    pub fn of(&self, headers: &HeaderMap) -> Option<String> {
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let cookie = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .find_map(|c| c.trim().strip_prefix(COOKIE)?.strip_prefix('='));
        bearer
            .into_iter()
            .chain(cookie)
            .find_map(|token| self.user(token.trim()))
            .map(str::to_owned)
    }

    /// The token `user` signs the console's forms with.
    pub fn csrf(&self, user: &str) -> String {
        hex::encode(self.mac(format!("csrf {user}").as_bytes()))
    }

    /// Whether `token` is `user`'s CSRF token, and the request came from this console's own
    /// pages (no `Origin`, or this host's).
    pub fn form_is_ours(&self, user: &str, token: &str, headers: &HeaderMap) -> bool {
        let same_origin = match headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
            None => true,
            Some(origin) => {
                let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
                let origin_host = origin.split_once("://").map(|(_, h)| h);
                host.is_some() && origin_host == host
            }
        };
        let Ok(presented) = hex::decode(token) else {
            return false;
        };
        let mut m = Hmac::new_from_slice(&self.key).expect("any key length");
        m.update(format!("csrf {user}").as_bytes());
        same_origin && m.verify_slice(&presented).is_ok()
    }

    /// A new token for one use by `user`: its number and the number's HMAC.
    pub fn once(&self, user: &str) -> String {
        let n = self.issued.fetch_add(1, Ordering::Relaxed);
        format!(
            "{n}.{}",
            hex::encode(self.mac(format!("once {n} {user}").as_bytes()))
        )
    }

    /// Whether `token` is one [`Users::once`] made for `user` and was not used yet; it is used
    /// now.
    pub fn use_once(&self, user: &str, token: &str) -> bool {
        let Some((n, presented)) = token.split_once('.') else {
            return false;
        };
        let (Ok(n), Ok(presented)) = (n.parse::<u64>(), hex::decode(presented)) else {
            return false;
        };
        let mut m = Hmac::new_from_slice(&self.key).expect("any key length");
        m.update(format!("once {n} {user}").as_bytes());
        m.verify_slice(&presented).is_ok() && self.used.lock().expect("used lock").insert(n)
    }
}
