//! libpq's password lookup, which tokio-postgres does not do: a conninfo never holds a password.

use std::path::{Path, PathBuf};

use tokio_postgres::config::Host;
use tokio_postgres::Config;

/// libpq's password lookup, which tokio-postgres does not do: `PGPASSWORD`, then the first
/// matching line `host:port:database:user:password` of the password file (`*` matches anything,
/// `\` escapes `:` and `\`).
pub fn with_password(mut config: Config) -> Config {
    if config.get_password().is_some() {
        return config;
    }
    if let Ok(password) = std::env::var("PGPASSWORD") {
        config.password(password);
        return config;
    }
    let file = std::env::var_os("PGPASSFILE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pgpass")));
    let Some(text) = file.and_then(|f| std::fs::read_to_string(f).ok()) else {
        return config;
    };
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        _ => "localhost".to_owned(),
    };
    let port = config
        .get_ports()
        .first()
        .copied()
        .unwrap_or(5432)
        .to_string();
    let user = config.get_user().unwrap_or_default().to_owned();
    let dbname = config.get_dbname().unwrap_or(&user).to_owned();
    if let Some(password) = pgpass_lookup(&text, [&host, &port, &dbname, &user]) {
        config.password(password);
    }
    config
}

fn pgpass_lookup(text: &str, wanted: [&str; 4]) -> Option<String> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .find_map(|line| {
            let fields = split_pgpass_line(line);
            let [host, port, db, user, password] = fields.as_slice() else {
                return None;
            };
            [host, port, db, user]
                .iter()
                .zip(wanted)
                .all(|(field, want)| *field == "*" || *field == want)
                .then(|| password.clone())
        })
}

fn split_pgpass_line(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => fields.last_mut().unwrap().extend(chars.next()),
            ':' if fields.len() < 5 => fields.push(String::new()),
            c => fields.last_mut().unwrap().push(c),
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgpass_matches_like_libpq() {
        let file = "# comment\n\
                    db1.internal:5432:app:mover:first\n\
                    *:5433:*:mover:wild\\:card\n\
                    *:*:*:*:fallback\n";
        let get = |h, p, d, u| pgpass_lookup(file, [h, p, d, u]);
        assert_eq!(
            get("db1.internal", "5432", "app", "mover").as_deref(),
            Some("first")
        );
        assert_eq!(
            get("db2.internal", "5433", "x", "mover").as_deref(),
            Some("wild:card")
        );
        assert_eq!(
            get("db1.internal", "5432", "other", "mover").as_deref(),
            Some("fallback")
        );
        assert_eq!(
            pgpass_lookup("h:1:d:u\n", ["h", "1", "d", "u"]),
            None,
            "four fields"
        );
    }
}
