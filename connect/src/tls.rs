//! `sslmode=require`, verified: the server's certificate against the system's roots or the file
//! `PGSSLROOTCERT` names (stricter than libpq's `require`, which checks nothing).

use std::path::Path;
use std::sync::OnceLock;

use postgres_native_tls::MakeTlsConnector;

use crate::ConnectError;

/// The TLS connector, made once: the system's roots, and every certificate in the file
/// `PGSSLROOTCERT` names.
pub(crate) fn tls() -> Result<MakeTlsConnector, ConnectError> {
    static TLS: OnceLock<Result<MakeTlsConnector, String>> = OnceLock::new();
    TLS.get_or_init(|| {
        let mut builder = native_tls::TlsConnector::builder();
        if let Some(path) = std::env::var_os("PGSSLROOTCERT") {
            let named = |e: &dyn std::fmt::Display| {
                format!("PGSSLROOTCERT {}: {e}", Path::new(&path).display())
            };
            let pem = std::fs::read_to_string(&path).map_err(|e| named(&e))?;
            // A bundle: every certificate in the file is a root.
            const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
            for block in pem.split(BEGIN).skip(1) {
                let one = format!("{BEGIN}{block}");
                let root =
                    native_tls::Certificate::from_pem(one.as_bytes()).map_err(|e| named(&e))?;
                builder.add_root_certificate(root);
            }
        }
        let connector = builder.build().map_err(|e| format!("TLS: {e}"))?;
        Ok(MakeTlsConnector::new(connector))
    })
    .clone()
    .map_err(ConnectError::Tls)
}
