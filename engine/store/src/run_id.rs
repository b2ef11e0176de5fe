//! Run identifiers: validated before they ever become a path component.

use std::fmt;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::atomic::random_hex;
use super::StoreError;

pub const MAX_RUN_ID_LEN: usize = 128;

/// A validated run id: 1..=128 characters of `[A-Za-z0-9._-]`, starting with a letter or digit,
/// never containing `..`. Safe to use as a single path component.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RunId(String);

impl RunId {
    /// A fresh id: UTC timestamp plus 32 random bits, e.g. `20261130T012233Z-9f3a1c2b`.
    /// Ids sort by creation time (to the second).
    pub fn generate() -> Result<RunId, StoreError> {
        let stamp: String = humantime::format_rfc3339_seconds(SystemTime::now())
            .to_string()
            .chars()
            .filter(|c| *c != '-' && *c != ':')
            .collect();
        RunId::parse(&format!("{stamp}-{}", random_hex(4)?))
    }

    pub fn parse(s: &str) -> Result<RunId, StoreError> {
        let invalid = |reason| StoreError::InvalidRunId {
            id: s.to_string(),
            reason,
        };
        if s.is_empty() {
            return Err(invalid("it is empty"));
        }
        if s.len() > MAX_RUN_ID_LEN {
            return Err(invalid("it is longer than 128 characters"));
        }
        if !s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err(invalid("it contains a character outside A-Z a-z 0-9 . _ -"));
        }
        if !s.as_bytes()[0].is_ascii_alphanumeric() {
            return Err(invalid("it does not start with a letter or digit"));
        }
        if s.contains("..") {
            return Err(invalid("it contains '..'"));
        }
        Ok(RunId(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for RunId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for RunId {
    type Error = StoreError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        RunId::parse(&s)
    }
}

impl From<RunId> for String {
    fn from(id: RunId) -> String {
        id.0
    }
}

impl std::str::FromStr for RunId {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RunId::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_table() {
        let long_ok = "a".repeat(128);
        let too_long = "a".repeat(129);
        let valid = [
            "a",
            "7",
            "run-1",
            "my_run.2",
            "20261130T012233Z-9f3a1c2b",
            "A.b_c-D",
            long_ok.as_str(),
        ];
        for id in valid {
            assert_eq!(RunId::parse(id).unwrap().as_str(), id);
        }
        let invalid = [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            "/abs",
            "a..b",
            "-leading",
            "_leading",
            ".hidden",
            "a\0b",
            "a b",
            "a\nb",
            "é",
            "a\\b",
            too_long.as_str(),
        ];
        for id in invalid {
            let err = RunId::parse(id).unwrap_err();
            assert!(
                matches!(err, StoreError::InvalidRunId { .. }),
                "{id:?}: {err}"
            );
            assert!(err.to_string().contains("invalid run id"), "{err}");
        }
    }

    #[test]
    fn generated_ids_are_valid_timestamped_and_distinct() {
        let a = RunId::generate().unwrap();
        let b = RunId::generate().unwrap();
        assert_ne!(a, b);
        let s = a.as_str();
        assert_eq!(s.len(), "20261130T012233Z-9f3a1c2b".len(), "{s}");
        assert_eq!(&s[8..9], "T");
        assert_eq!(&s[15..17], "Z-");
        assert!(s[..8].bytes().all(|b| b.is_ascii_digit()));
        assert!(s[17..].bytes().all(|b| b.is_ascii_hexdigit()));
    }

    #[test]
    fn serde_validates() {
        let id: RunId = serde_json::from_str("\"ok-1\"").unwrap();
        assert_eq!(id.as_str(), "ok-1");
        assert!(serde_json::from_str::<RunId>("\"../x\"").is_err());
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"ok-1\"");
    }
}
