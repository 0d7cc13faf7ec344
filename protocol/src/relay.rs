//! What the relay (`shard-directory relay`) publishes to the clients: each version of the
//! directory it reads, with the keys changed since the one before, sealed with HMAC-SHA256 under
//! a key the relay and the clients share. Whoever can publish on the channel without the key can
//! only be ignored: a client takes a message only when its seal is right. A sealed message stays
//! a true statement of the directory's history (`since` to `version`, in `epoch`), so one
//! replayed is harmless as long as the client checks the epoch and how old it is (a restore that
//! keeps the timeline reuses versions): see [`Change::sealed_at_ms`].
//!
//! On the wire: `<hex HMAC of the JSON>.<JSON>`.

use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// One read of the directory's version by the relay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// `directory_epoch()` when read.
    pub epoch: String,
    /// The version the relay knew before this read (equal to `version`: nothing changed, a
    /// heartbeat).
    pub since: i64,
    /// The directory's version.
    pub version: i64,
    /// Every key changed after `since`, with the latest version that changed it (type, id,
    /// version); `None` when the directory could not say (history purged, too many changes).
    pub changed: Option<Vec<(String, String, i64)>>,
    /// When the relay sealed the message, in milliseconds since the Unix epoch: a client drops
    /// one older than it allows.
    pub sealed_at_ms: u64,
}

/// Why a message was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unsealed {
    /// Not `<hex>.<JSON>` of a [`Change`].
    Malformed,
    /// The seal does not match the key: not sent by a relay that holds it, or altered.
    Forged,
}

fn mac(key: &[u8]) -> Hmac<Sha256> {
    Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length")
}

/// The message a relay holding `key` publishes.
pub fn seal(change: &Change, key: &[u8]) -> String {
    let json = serde_json::to_string(change).expect("a change serializes");
    let mut mac = mac(key);
    mac.update(json.as_bytes());
    format!("{}.{json}", hex::encode(mac.finalize().into_bytes()))
}

/// The change in `message`, when it was sealed with `key` (checked in constant time).
pub fn open(message: &str, key: &[u8]) -> Result<Change, Unsealed> {
    let (seal, json) = message.split_once('.').ok_or(Unsealed::Malformed)?;
    let seal = hex::decode(seal).map_err(|_| Unsealed::Malformed)?;
    let mut mac = mac(key);
    mac.update(json.as_bytes());
    mac.verify_slice(&seal).map_err(|_| Unsealed::Forged)?;
    serde_json::from_str(json).map_err(|_| Unsealed::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change() -> Change {
        Change {
            epoch: "7301.1".into(),
            since: 4,
            version: 6,
            changed: Some(vec![("tenant".into(), "8842".into(), 6)]),
            sealed_at_ms: 1_764_000_000_000,
        }
    }

    #[test]
    fn a_sealed_change_opens_with_its_key_only_and_not_once_altered() {
        let sealed = seal(&change(), b"key");
        assert_eq!(open(&sealed, b"key"), Ok(change()));
        assert_eq!(open(&sealed, b"another key"), Err(Unsealed::Forged));
        let altered = sealed.replace("\"version\":6", "\"version\":9");
        assert_ne!(altered, sealed);
        assert_eq!(open(&altered, b"key"), Err(Unsealed::Forged));
        assert_eq!(open("no seal", b"key"), Err(Unsealed::Malformed));
        assert_eq!(open("zz.{}", b"key"), Err(Unsealed::Malformed));
        let (seal, _) = sealed.split_once('.').unwrap();
        let mut forged_json = mac(b"key");
        forged_json.update(b"{}");
        let other = format!("{}.{{}}", hex::encode(forged_json.finalize().into_bytes()));
        assert_ne!(seal, other.split_once('.').unwrap().0);
        assert_eq!(
            open(&other, b"key"),
            Err(Unsealed::Malformed),
            "sealed, not a change"
        );
    }
}
