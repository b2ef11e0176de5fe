//! Bytes as hex text and back: salts, temporary names, fingerprints and the protocol's non-UTF-8
//! arguments. Encoding writes lower case (the form every artifact uses); decoding accepts either
//! case, since a peer may write upper case for the same bytes. Ids, which must have one spelling,
//! are decoded by [`crate::hex_id`] instead.

/// Why a text is not hex.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HexError {
    #[error("odd number of hex digits")]
    OddLength,
    #[error("invalid hex digit {found:?} at position {index}")]
    InvalidDigit { index: usize, found: char },
}

const LOWER: &[u8; 16] = b"0123456789abcdef";

/// `bytes` as lower-case hex, two digits a byte.
pub fn encode(bytes: impl AsRef<[u8]>) -> String {
    let bytes = bytes.as_ref();
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(LOWER[usize::from(b >> 4)]));
        out.push(char::from(LOWER[usize::from(b & 0x0f)]));
    }
    out
}

/// The bytes `text` spells, two digits (either case) a byte.
pub fn decode(text: impl AsRef<[u8]>) -> Result<Vec<u8>, HexError> {
    let text = text.as_ref();
    if text.len() % 2 != 0 {
        return Err(HexError::OddLength);
    }
    text.chunks_exact(2)
        .enumerate()
        .map(|(i, pair)| Ok((digit(pair[0], 2 * i)? << 4) | digit(pair[1], 2 * i + 1)?))
        .collect()
}

fn digit(c: u8, index: usize) -> Result<u8, HexError> {
    match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        b'A'..=b'F' => Ok(c - b'A' + 10),
        _ => Err(HexError::InvalidDigit {
            index,
            found: char::from(c),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_lower_case_two_digits_a_byte() {
        assert_eq!(encode([]), "");
        assert_eq!(encode([0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(encode(b"agentdiff"), "6167656e7464696666");
    }

    #[test]
    fn every_byte_value_round_trips_in_either_case() {
        let all: Vec<u8> = (0..=255).collect();
        let text = encode(&all);
        assert_eq!(text.len(), 512);
        assert_eq!(decode(&text), Ok(all.clone()));
        assert_eq!(decode(text.to_uppercase()), Ok(all));
        assert_eq!(decode("aBcD"), Ok(vec![0xab, 0xcd]));
    }

    #[test]
    fn odd_lengths_and_invalid_digits_are_refused() {
        assert_eq!(decode(""), Ok(vec![]));
        assert_eq!(decode("a"), Err(HexError::OddLength));
        assert_eq!(decode("abc"), Err(HexError::OddLength));
        // An odd length is reported before any digit is looked at.
        assert_eq!(decode("zzz"), Err(HexError::OddLength));
        assert_eq!(
            decode("0g"),
            Err(HexError::InvalidDigit {
                index: 1,
                found: 'g'
            })
        );
        assert_eq!(
            decode("00 1"),
            Err(HexError::InvalidDigit {
                index: 2,
                found: ' '
            })
        );
        for bad in ["0x", "+1", "-1", "G0", ":0", "`0", "/0", "@0"] {
            assert!(
                matches!(decode(bad), Err(HexError::InvalidDigit { .. })),
                "{bad:?}"
            );
        }
        // A byte beyond ASCII is named by its value, not decoded as UTF-8.
        assert_eq!(
            decode("\u{e9}"),
            Err(HexError::InvalidDigit {
                index: 0,
                found: '\u{c3}'
            })
        );
        assert_eq!(
            HexError::InvalidDigit {
                index: 3,
                found: 'x'
            }
            .to_string(),
            "invalid hex digit 'x' at position 3"
        );
    }
}
