//! SOCKS5 (RFC 1928) `CONNECT`, without authentication, names resolved by the proxy.
//!
//! Invariants: every length is checked before it is read; only `CONNECT` is served (`BIND` and
//! `UDP ASSOCIATE` are refused with "command not supported", so no UDP is relayed); a domain name
//! is decided and resolved by the proxy (`socks5h` semantics), an address is decided as written.

use std::net::{Ipv4Addr, Ipv6Addr};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const VERSION: u8 = 5;
const NO_AUTH: u8 = 0;
const NO_ACCEPTABLE: u8 = 0xff;
const CMD_CONNECT: u8 = 1;

/// SOCKS5 reply codes used here.
pub(crate) const REPLY_OK: u8 = 0;
pub(crate) const REPLY_NOT_ALLOWED: u8 = 2;
pub(crate) const REPLY_HOST_UNREACHABLE: u8 = 4;
const REPLY_COMMAND: u8 = 7;
const REPLY_ADDRESS_TYPE: u8 = 8;

#[derive(Debug, thiserror::Error)]
pub(crate) enum SocksError {
    #[error("reading the SOCKS5 request failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("the client offers no SOCKS5 method without authentication")]
    NoMethod,
    #[error("not a SOCKS5 request (version {0})")]
    Version(u8),
    #[error("SOCKS5 command {0} is not supported (only CONNECT)")]
    Command(u8),
    #[error("SOCKS5 address type {0} is not supported")]
    AddressType(u8),
    #[error("the SOCKS5 domain name is not UTF-8")]
    Name,
}

/// A SOCKS5 `CONNECT` target.
#[derive(Debug)]
pub(crate) struct SocksRequest {
    pub(crate) host: String,
    pub(crate) port: u16,
    /// Bytes the client sent after the request without waiting for the reply.
    pub(crate) early: Vec<u8>,
}

/// Read the greeting (`already` holds what was read of it, starting with the version byte) and
/// the request; answer the method selection. A refused request is answered here.
pub(crate) async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    client: &mut S,
    already: &[u8],
) -> Result<SocksRequest, SocksError> {
    let mut reader = already.chain(&mut *client);
    let mut head = [0u8; 2];
    reader.read_exact(&mut head).await?;
    let mut methods = vec![0u8; usize::from(head[1])];
    reader.read_exact(&mut methods).await?;
    if !methods.contains(&NO_AUTH) {
        client.write_all(&[VERSION, NO_ACCEPTABLE]).await?;
        return Err(SocksError::NoMethod);
    }
    // What the client sent beyond the greeting (a pipelined request) stays in `reader`.
    let (rest, _) = reader.into_inner();
    let rest = rest.to_vec();
    client.write_all(&[VERSION, NO_AUTH]).await?;
    let mut reader = rest.as_slice().chain(&mut *client);
    let mut req = [0u8; 4];
    reader.read_exact(&mut req).await?;
    let [version, command, _, atyp] = req;
    if version != VERSION {
        return Err(SocksError::Version(version));
    }
    if command != CMD_CONNECT {
        drop(reader);
        client.write_all(&reply(REPLY_COMMAND)).await?;
        return Err(SocksError::Command(command));
    }
    let host = match atyp {
        1 => {
            let mut a = [0u8; 4];
            reader.read_exact(&mut a).await?;
            Ipv4Addr::from(a).to_string()
        }
        3 => {
            let len = reader.read_u8().await?;
            let mut name = vec![0u8; usize::from(len)];
            reader.read_exact(&mut name).await?;
            String::from_utf8(name).map_err(|_| SocksError::Name)?
        }
        4 => {
            let mut a = [0u8; 16];
            reader.read_exact(&mut a).await?;
            Ipv6Addr::from(a).to_string()
        }
        other => {
            drop(reader);
            client.write_all(&reply(REPLY_ADDRESS_TYPE)).await?;
            return Err(SocksError::AddressType(other));
        }
    };
    let port = reader.read_u16().await?;
    let (early, _) = reader.into_inner();
    Ok(SocksRequest {
        host,
        port,
        early: early.to_vec(),
    })
}

/// A reply with an unspecified bound address (the client never needs it for `CONNECT`).
pub(crate) fn reply(code: u8) -> [u8; 10] {
    [VERSION, code, 0, 1, 0, 0, 0, 0, 0, 0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(input: Vec<u8>) -> Result<SocksRequest, SocksError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let (mut ours, mut theirs) = tokio::io::duplex(4096);
            theirs.write_all(&input).await.unwrap();
            // End of input, while our replies still have somewhere to go.
            theirs.shutdown().await.unwrap();
            let r = handshake(&mut ours, &[]).await;
            drop(theirs);
            r
        })
    }

    #[test]
    fn a_pipelined_request_and_early_data_are_kept() {
        let mut input = vec![5, 1, 0, 5, 1, 0, 3, 6];
        input.extend_from_slice(b"a.test");
        input.extend_from_slice(&443u16.to_be_bytes());
        input.extend_from_slice(b"early");
        // Everything arrives as the "already read" first chunk.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let r = rt
            .block_on(async {
                let (mut ours, _theirs) = tokio::io::duplex(64);
                handshake(&mut ours, &input).await
            })
            .unwrap();
        assert_eq!((r.host.as_str(), r.port), ("a.test", 443));
        assert_eq!(r.early, b"early");
        let r = run(vec![
            5, 1, 0, 5, 1, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 80,
        ])
        .unwrap();
        assert_eq!((r.host.as_str(), r.port), ("::1", 80));
    }

    proptest! {
        /// Whatever a client sends, the handshake ends (the input runs out) without a panic.
        #[test]
        fn any_input_ends(input in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut bytes = vec![5];
            bytes.extend(input);
            let _ = run(bytes);
        }
    }
}
