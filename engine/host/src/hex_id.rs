//! Object and tree ids (lower-case hex SHA-256) in binary: the form every table keys them by.
//!
//! A scan looks up each directory's id several times and the tamper check each object's once,
//! so decoding is on the hot path: a table lookup per digit, with no branch on whether a digit is
//! a number or a letter (random hex mispredicts such a branch half the time).

/// Each byte's value as a hex digit, or [`INVALID`]. Only lower-case digits: ids are written
/// lower-case, and accepting another spelling of the same id would let one name stand for two.
const DIGITS: [u8; 256] = {
    let mut t = [INVALID; 256];
    let mut c = 0;
    while c < 10 {
        t[b'0' as usize + c] = c as u8;
        c += 1;
    }
    let mut c = 0;
    while c < 6 {
        t[b'a' as usize + c] = 10 + c as u8;
        c += 1;
    }
    t
};
const INVALID: u8 = 0xff;

/// The 32 bytes of a 64-digit lower-case hex id; `None` for anything else.
pub fn decode(id: &str) -> Option<[u8; 32]> {
    let b = id.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    let mut bad = 0u8;
    for (o, pair) in out.iter_mut().zip(b.chunks_exact(2)) {
        let (hi, lo) = (DIGITS[usize::from(pair[0])], DIGITS[usize::from(pair[1])]);
        // Both are at most 0x0f unless invalid, where the high bit shows.
        bad |= hi | lo;
        *o = (hi << 4) | (lo & 0x0f);
    }
    (bad & 0xf0 == 0).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_lower_case_ids_only() {
        let id = "00ff10a9".repeat(8);
        let want: [u8; 32] = crate::hex::decode(&id).unwrap().try_into().unwrap();
        assert_eq!(decode(&id), Some(want));
        assert_eq!(
            decode(&id.to_uppercase()),
            None,
            "another spelling of the same id"
        );
        assert_eq!(decode(&id[..62]), None);
        assert_eq!(decode(&format!("{id}0")), None);
        for bad in ["g", "G", " ", "/", ":", "`", "\u{e9}"] {
            let forged = format!("{bad}{}", &id[bad.len()..]);
            assert_eq!(decode(&forged), None, "{forged:?}");
        }
    }

    #[test]
    fn agrees_with_the_hex_encoding_on_every_byte_value() {
        for b in 0..=255u8 {
            let id = crate::hex::encode([b; 32]);
            assert_eq!(decode(&id), Some([b; 32]));
        }
    }
}
