//! Who may read the dashboard: a request must name a loopback host (DNS rebinding) and carry this
//! server's token.
//!
//! Invariants: the token is 128 bits from the OS random source, fresh for every start, never
//! written anywhere but the one URL printed at start; it is compared in constant time (`subtle`);
//! there is no switch, flag or environment variable that skips either check.
//!
//! Not defended: any local user or process that learns the URL (shell history of a pasted URL,
//! a screen share, the terminal's scrollback) can read every run in the store until the server
//! stops.

use subtle::ConstantTimeEq;

/// Token length in bytes (128 bits).
const TOKEN_BYTES: usize = 16;

/// The access token of one server start.
pub struct Token {
    hex: String,
}

impl Token {
    /// A fresh token from the OS random source.
    pub fn generate() -> Result<Token, getrandom::Error> {
        let mut bytes = [0u8; TOKEN_BYTES];
        getrandom::getrandom(&mut bytes)?;
        Ok(Token {
            hex: bytes.iter().map(|b| format!("{b:02x}")).collect(),
        })
    }

    pub fn as_str(&self) -> &str {
        &self.hex
    }

    /// Whether `candidate` is this token, in time independent of where they differ.
    pub fn matches(&self, candidate: &str) -> bool {
        // `ct_eq` on slices of different lengths is false without comparing contents; the length
        // (32) is public.
        bool::from(candidate.as_bytes().ct_eq(self.hex.as_bytes()))
    }
}

/// The `token` query parameter, if present (the first one).
pub fn query_token(query: Option<&str>) -> Option<&str> {
    query?
        .split('&')
        .find_map(|pair| pair.strip_prefix("token="))
}

/// The token of an `Authorization: Bearer …` header value.
pub fn bearer_token(authorization: Option<&str>) -> Option<&str> {
    let value = authorization?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Whether a `Host` header names this server by a loopback name: `127.0.0.1`, `localhost` or
/// `[::1]`, with this server's port. Anything else (another name that resolves here, as in DNS
/// rebinding, or no Host at all) is refused.
pub fn host_allowed(host: Option<&str>, port: u16) -> bool {
    let Some(host) = host else {
        return false;
    };
    let Some((name, p)) = host.rsplit_once(':') else {
        return false;
    };
    let loopback = name.eq_ignore_ascii_case("localhost") || name == "127.0.0.1" || name == "[::1]";
    // The port exactly as a browser writes it: `parse` would also take `+8080` and `08080`.
    loopback && p == port.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_fresh_128_bit_hex_and_compare_exactly() {
        let (a, b) = (Token::generate().unwrap(), Token::generate().unwrap());
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a.as_str(), b.as_str());
        assert!(a.matches(a.as_str()));
        assert!(!a.matches(b.as_str()));
        assert!(!a.matches(""));
        assert!(!a.matches(&a.as_str()[..31]));
        assert!(!a.matches(&format!("{}0", a.as_str())));
    }

    #[test]
    fn only_loopback_names_with_our_port_are_allowed() {
        for ok in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST:8080",
            "[::1]:8080",
        ] {
            assert!(host_allowed(Some(ok), 8080), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "127.0.0.1:8081",
            "127.0.0.1",
            "localhost",
            "127.0.0.2:8080",
            "localhost.evil.example:8080",
            "0.0.0.0:8080",
            "localhost:+8080",
            "localhost:08080",
            "localhost:8080 ",
            " localhost:8080",
            "localhost:",
            "",
        ] {
            assert!(!host_allowed(Some(bad), 8080), "{bad}");
        }
        assert!(!host_allowed(None, 8080));
    }

    #[test]
    fn tokens_are_found_in_the_query_and_the_bearer_header() {
        assert_eq!(query_token(Some("a=1&token=abc")), Some("abc"));
        assert_eq!(query_token(Some("xtoken=abc")), None);
        assert_eq!(query_token(None), None);
        assert_eq!(bearer_token(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(Some("bearer abc")), Some("abc"));
        assert_eq!(bearer_token(Some("Basic abc")), None);
    }
}
