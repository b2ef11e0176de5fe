//! Unpredictable bytes for salts and temporary names that another process must not guess, from
//! the kernel's CSPRNG: `getrandom(2)` on Linux, `getentropy(3)` elsewhere.
//!
//! There is deliberately no fallback to `/dev/urandom`: every kernel agentdiff supports has the
//! call (Linux 3.17+), a sandbox need not have `/dev` at all, and a seccomp filter that refuses the
//! call is reported as an error rather than worked around.

/// Why no random bytes could be had.
#[derive(Debug, thiserror::Error)]
pub enum RandomError {
    #[error("the kernel's random source failed: {0}")]
    Os(#[source] std::io::Error),
    #[error("the kernel's random source returned no bytes")]
    NoProgress,
}

/// Fill `buf` with bytes from the kernel's CSPRNG.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn fill(buf: &mut [u8]) -> Result<(), RandomError> {
    let mut rest = buf;
    while !rest.is_empty() {
        // SAFETY: the pointer and length describe `rest`, a live mutable slice the kernel
        // writes at most `rest.len()` bytes of; flags 0 reads the same pool as /dev/urandom,
        // waiting only until it is first seeded at boot.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            // A signal during the wait for the first seeding, or a large read: try again.
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(RandomError::Os(e));
        }
        // A short read leaves the rest for the next call; none at all would loop for ever.
        let n = usize::try_from(n).map_err(|_| RandomError::NoProgress)?;
        if n == 0 {
            return Err(RandomError::NoProgress);
        }
        rest = rest.get_mut(n..).ok_or(RandomError::NoProgress)?;
    }
    Ok(())
}

/// Fill `buf` with bytes from the kernel's CSPRNG.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub fn fill(buf: &mut [u8]) -> Result<(), RandomError> {
    // getentropy(3) gives at most 256 bytes a call, and all of them or an error.
    for chunk in buf.chunks_mut(256) {
        // SAFETY: the pointer and length describe `chunk`, a live mutable slice of at most 256
        // bytes, which the call fills.
        if unsafe { libc::getentropy(chunk.as_mut_ptr().cast(), chunk.len()) } != 0 {
            return Err(RandomError::Os(std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_every_byte_and_differs_between_calls() {
        // Larger than one getentropy call and than getrandom's uninterruptible 256 bytes.
        let (mut a, mut b) = (vec![0u8; 4096], vec![0u8; 4096]);
        fill(&mut a).unwrap();
        fill(&mut b).unwrap();
        assert_ne!(a, b);
        // 32 zero bytes in a row come by chance with a probability near 2^-244 here; they
        // mean part of the buffer was left unwritten.
        for buf in [&a, &b] {
            assert!(!buf.windows(32).any(|w| w.iter().all(|&x| x == 0)));
        }
        let mut empty = [0u8; 0];
        fill(&mut empty).unwrap();
    }

    #[test]
    fn sixteen_byte_salts_do_not_repeat() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            let mut salt = [0u8; 16];
            fill(&mut salt).unwrap();
            assert!(seen.insert(salt));
        }
    }
}
