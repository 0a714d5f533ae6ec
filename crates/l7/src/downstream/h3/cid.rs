//! Connection IDs that name their worker, address-validation (Retry)
//! tokens, and stateless-reset tokens. The keys are made once per process
//! and shared by its workers, so any worker checks what another made.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Length of the connection IDs Gatehouse issues: the first byte names the
/// worker that owns the connection, the other fifteen are random.
pub const CID_LEN: usize = 16;

/// How long a Retry token is good for: one round trip, with room.
const TOKEN_LIFE: Duration = Duration::from_secs(30);
const MAC_LEN: usize = 16;

/// The process's secrets for tokens and resets, zeroed on drop.
pub struct Keys {
    token: [u8; 32],
    reset: [u8; 32],
}

impl Drop for Keys {
    fn drop(&mut self) {
        use zeroize::Zeroize;
        self.token.zeroize();
        self.reset.zeroize();
    }
}

fn mac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut data = Vec::with_capacity(64);
    for p in parts {
        // Each part length-prefixed, so parts cannot slide into each other.
        data.push(p.len() as u8);
        data.extend_from_slice(p);
    }
    // HMAC-SHA256 does not fail with a 32-byte key; if BoringSSL says
    // otherwise, an all-zero MAC matches no token it made.
    boring::hash::hmac_sha256(key, &data).unwrap_or([0; 32])
}

fn addr_bytes(a: &SocketAddr) -> ([u8; 18], usize) {
    let mut out = [0u8; 18];
    let ip = match a.ip() {
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        std::net::IpAddr::V6(v6) => v6,
    };
    out[..16].copy_from_slice(&ip.octets());
    out[16..].copy_from_slice(&a.port().to_be_bytes());
    (out, 18)
}

impl Default for Keys {
    fn default() -> Self {
        Keys::new()
    }
}

impl Keys {
    pub fn new() -> Keys {
        let mut k = Keys { token: [0; 32], reset: [0; 32] };
        // BoringSSL's RNG does not fail on Linux; if it did, keys from the
        // clock and the address space would still differ per process.
        if boring::rand::rand_bytes(&mut k.token).is_err() || boring::rand::rand_bytes(&mut k.reset).is_err() {
            let seed = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            k.token = mac(&seed.to_le_bytes(), &[b"token"]);
            k.reset = mac(&seed.to_le_bytes(), &[b"reset"]);
        }
        k
    }

    /// A new connection ID owned by `worker`.
    pub fn new_cid(&self, worker: usize) -> [u8; CID_LEN] {
        let mut cid = [0u8; CID_LEN];
        if boring::rand::rand_bytes(&mut cid).is_err() {
            for b in &mut cid {
                *b = fastrand::u8(..);
            }
        }
        cid[0] = worker as u8;
        cid
    }

    /// The stateless-reset token of one of our connection IDs: a peer that
    /// holds it can tell a reset from us from a forged one (RFC 9000 10.3).
    pub fn reset_token(&self, cid: &[u8]) -> u128 {
        let m = mac(&self.reset, &[cid]);
        let mut t = [0u8; 16];
        t.copy_from_slice(&m[..16]);
        u128::from_be_bytes(t)
    }

    /// A Retry token for a client at `peer` whose first Initial went to
    /// `odcid`.
    pub fn retry_token(&self, peer: &SocketAddr, odcid: &[u8]) -> Vec<u8> {
        self.retry_token_at(peer, odcid, SystemTime::now())
    }

    fn retry_token_at(&self, peer: &SocketAddr, odcid: &[u8], now: SystemTime) -> Vec<u8> {
        let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()).to_be_bytes();
        let (a, n) = addr_bytes(peer);
        let m = mac(&self.token, &[&secs, &a[..n], odcid]);
        let mut t = Vec::with_capacity(8 + 1 + odcid.len() + MAC_LEN);
        t.extend_from_slice(&secs);
        t.push(odcid.len() as u8);
        t.extend_from_slice(odcid);
        t.extend_from_slice(&m[..MAC_LEN]);
        t
    }

    /// The original destination connection ID a token carries, if we made
    /// it for this address less than [`TOKEN_LIFE`] ago.
    pub fn check_token<'a>(&self, token: &'a [u8], peer: &SocketAddr) -> Option<&'a [u8]> {
        self.check_token_at(token, peer, SystemTime::now())
    }

    fn check_token_at<'a>(&self, token: &'a [u8], peer: &SocketAddr, now: SystemTime) -> Option<&'a [u8]> {
        let (secs, rest) = token.split_first_chunk::<8>()?;
        let (&len, rest) = rest.split_first()?;
        let len = usize::from(len);
        if len > quiche::MAX_CONN_ID_LEN || rest.len() != len + MAC_LEN {
            return None;
        }
        let (odcid, tag) = rest.split_at(len);
        let (a, n) = addr_bytes(peer);
        let m = mac(&self.token, &[secs, &a[..n], odcid]);
        if !boring::memcmp::eq(&m[..MAC_LEN], tag) {
            return None;
        }
        let made = UNIX_EPOCH + Duration::from_secs(u64::from_be_bytes(*secs));
        let age = now.duration_since(made).ok()?;
        (age <= TOKEN_LIFE).then_some(odcid)
    }
}

/// The worker a connection ID of ours names, if it has our length.
pub fn worker_of(cid: &[u8]) -> Option<usize> {
    (cid.len() == CID_LEN).then(|| usize::from(cid[0]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> SocketAddr {
        "192.0.2.7:4433".parse().expect("addr")
    }

    #[test]
    fn a_token_holds_for_its_address_and_its_time_only() {
        let k = Keys::new();
        let odcid = [9u8; 8];
        let now = SystemTime::now();
        let t = k.retry_token_at(&peer(), &odcid, now);
        assert_eq!(k.check_token_at(&t, &peer(), now), Some(&odcid[..]));
        let elsewhere: SocketAddr = "192.0.2.7:4434".parse().expect("addr");
        assert_eq!(k.check_token_at(&t, &elsewhere, now), None);
        assert_eq!(k.check_token_at(&t, &peer(), now + Duration::from_secs(31)), None);
        // Another process's key, and every single-bit change, are refused.
        assert_eq!(Keys::new().check_token_at(&t, &peer(), now), None);
        for i in 0..t.len() {
            let mut forged = t.clone();
            forged[i] ^= 1;
            assert_eq!(k.check_token_at(&forged, &peer(), now), None, "bit flipped at {i}");
        }
        assert_eq!(k.check_token_at(&t[..t.len() - 1], &peer(), now), None);
        assert_eq!(k.check_token_at(b"", &peer(), now), None);
    }

    #[test]
    fn cids_name_their_worker_and_resets_are_per_cid() {
        let k = Keys::new();
        let a = k.new_cid(3);
        let b = k.new_cid(3);
        assert_eq!(worker_of(&a), Some(3));
        assert_ne!(a, b);
        assert_eq!(worker_of(&a[..8]), None);
        assert_eq!(k.reset_token(&a), k.reset_token(&a));
        assert_ne!(k.reset_token(&a), k.reset_token(&b));
    }
}
