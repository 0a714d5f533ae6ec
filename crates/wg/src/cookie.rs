//! Cookies (whitepaper section 5.4.7): under load a responder answers a
//! handshake message whose mac2 is not valid with a cookie reply instead of
//! doing the Diffie-Hellman work; the initiator keeps the cookie for two
//! minutes and proves with mac2 that it can receive at its address.
//!
//! The responder's cookie is a MAC of the sender's address under a secret
//! that changes every two minutes, so it holds no state per sender.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use subtle::ConstantTimeEq;

use crate::crypto::{self, KEY_LEN, Key, MAC_LEN, mac};
use crate::handshake::{Identity, PeerKey};
use crate::messages::{self, cookie_reply};

/// How long a cookie, and the secret behind it, is good for.
pub const COOKIE_LIFETIME: Duration = Duration::from_secs(120);

/// The bytes of a source address a cookie covers: the IP (16 bytes, an
/// IPv4 address in the first four) and the port.
fn address_bytes(src: SocketAddr) -> [u8; 18] {
    let mut b = [0u8; 18];
    match src.ip() {
        IpAddr::V4(a) => b[..4].copy_from_slice(&a.octets()),
        IpAddr::V6(a) => b[..16].copy_from_slice(&a.octets()),
    }
    b[16..].copy_from_slice(&src.port().to_be_bytes());
    b
}

/// The responder's side: makes cookies, checks mac2, writes cookie replies.
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub struct CookieChecker {
    secret: Key,
    born: Instant,
    /// Seals our cookie replies: HASH(LABEL_COOKIE || our public key).
    key: [u8; KEY_LEN],
}

impl CookieChecker {
    pub fn new(me: &Identity, now: Instant, rng: &mut impl rand_core::CryptoRngCore) -> CookieChecker {
        let mut secret = Key([0; KEY_LEN]);
        rng.fill_bytes(&mut secret.0);
        CookieChecker { secret, born: now, key: *me.cookie_key() }
    }

    fn cookie(&mut self, src: SocketAddr, now: Instant, rng: &mut impl rand_core::CryptoRngCore) -> [u8; MAC_LEN] {
        if now.saturating_duration_since(self.born) >= COOKIE_LIFETIME {
            rng.fill_bytes(&mut self.secret.0);
            self.born = now;
        }
        mac(&self.secret.0, &[&address_bytes(src)])
    }

    /// Whether mac2 of a handshake message (`mac1_at`: where its mac1 sits)
    /// proves the sender got a cookie for `src`.
    pub fn mac2_ok(
        &mut self,
        msg: &[u8],
        mac1_at: usize,
        src: SocketAddr,
        now: Instant,
        rng: &mut impl rand_core::CryptoRngCore,
    ) -> bool {
        let cookie = self.cookie(src, now, rng);
        let mac2_at = mac1_at + MAC_LEN;
        let Some(sent) = msg.get(mac2_at..mac2_at + MAC_LEN) else { return false };
        bool::from(mac(&cookie, &[&msg[..mac2_at]]).ct_eq(sent))
    }

    /// The cookie reply to a handshake message from `src` whose sender
    /// index is `receiver`.
    pub fn reply(
        &mut self,
        msg: &[u8],
        mac1_at: usize,
        receiver: u32,
        src: SocketAddr,
        now: Instant,
        rng: &mut impl rand_core::CryptoRngCore,
    ) -> [u8; cookie_reply::LEN] {
        let cookie = self.cookie(src, now, rng);
        let mut out = [0u8; cookie_reply::LEN];
        out[0] = messages::COOKIE_REPLY;
        out[cookie_reply::RECEIVER..cookie_reply::NONCE].copy_from_slice(&receiver.to_le_bytes());
        let mut nonce = [0u8; 24];
        rng.fill_bytes(&mut nonce);
        out[cookie_reply::NONCE..cookie_reply::COOKIE].copy_from_slice(&nonce);
        let field = &mut out[cookie_reply::COOKIE..];
        field[..MAC_LEN].copy_from_slice(&cookie);
        let mac1 = msg.get(mac1_at..mac1_at + MAC_LEN).unwrap_or(&[]);
        crypto::xseal_fixed(&self.key, &nonce, field, mac1);
        out
    }
}

/// Why a cookie reply was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CookieError {
    /// We sent nothing it could answer.
    Unexpected,
    /// It did not open: not from the peer, or not about our last message.
    Decrypt,
}

/// The initiator's side of one peer: the mac1 of the last handshake
/// message sent (what a cookie reply is bound to) and the cookie received.
#[derive(Default)]
#[cfg_attr(feature = "fuzzing", derive(Clone))]
pub struct CookieJar {
    last_mac1: Option<[u8; MAC_LEN]>,
    cookie: Option<([u8; MAC_LEN], Instant)>,
}

impl CookieJar {
    /// Notes a handshake message just sent (`mac1_at`: where its mac1 sits).
    pub fn sent(&mut self, msg: &[u8], mac1_at: usize) {
        let mut m = [0u8; MAC_LEN];
        if let Some(s) = msg.get(mac1_at..mac1_at + MAC_LEN) {
            m.copy_from_slice(s);
            self.last_mac1 = Some(m);
        }
    }

    /// Takes a cookie reply from `peer`.
    pub fn receive(
        &mut self,
        reply: &[u8; cookie_reply::LEN],
        peer: &PeerKey,
        now: Instant,
    ) -> Result<(), CookieError> {
        let mac1 = self.last_mac1.ok_or(CookieError::Unexpected)?;
        let mut nonce = [0u8; 24];
        nonce.copy_from_slice(&reply[cookie_reply::NONCE..cookie_reply::COOKIE]);
        let mut field = [0u8; MAC_LEN + crypto::TAG_LEN];
        field.copy_from_slice(&reply[cookie_reply::COOKIE..]);
        crypto::xopen_fixed(peer.cookie_key(), &nonce, &mut field, &mac1).map_err(|_| CookieError::Decrypt)?;
        let mut cookie = [0u8; MAC_LEN];
        cookie.copy_from_slice(&field[..MAC_LEN]);
        self.cookie = Some((cookie, now));
        Ok(())
    }

    /// The cookie for mac2, while it is fresh.
    pub fn cookie(&self, now: Instant) -> Option<&[u8; MAC_LEN]> {
        self.cookie.as_ref().filter(|(_, at)| now.saturating_duration_since(*at) < COOKIE_LIFETIME).map(|(c, _)| c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::StaticSecret;
    use crate::handshake::{initiate, tai64n};
    use crate::messages::initiation;

    #[test]
    fn a_cookie_round_trip_makes_mac2_valid_for_that_address_only() {
        let mut rng = rand_core::OsRng;
        let t0 = Instant::now();
        let (a, b) = (Identity::new(StaticSecret::random(&mut rng)), Identity::new(StaticSecret::random(&mut rng)));
        let a_sees_b = PeerKey::new(&a, *b.public(), None);
        let src: SocketAddr = "192.0.2.7:51820".parse().expect("addr");
        let mut checker = CookieChecker::new(&b, t0, &mut rng);
        let mut jar = CookieJar::default();
        let ts = tai64n(Duration::from_secs(1));
        let (first, _) = initiate(&a, &a_sees_b, 1, ts, None, &mut rng).expect("initiation");
        jar.sent(&first, initiation::MAC1);
        assert!(!checker.mac2_ok(&first, initiation::MAC1, src, t0, &mut rng), "no cookie yet");
        let reply = checker.reply(&first, initiation::MAC1, 1, src, t0, &mut rng);
        assert!(matches!(messages::parse(&reply), Ok(messages::Message::CookieReply(_))));
        jar.receive(&reply, &a_sees_b, t0).expect("opens");
        let cookie = jar.cookie(t0).copied();
        let (second, _) = initiate(&a, &a_sees_b, 2, ts, cookie.as_ref(), &mut rng).expect("initiation");
        assert!(checker.mac2_ok(&second, initiation::MAC1, src, t0, &mut rng));
        let elsewhere: SocketAddr = "192.0.2.8:51820".parse().expect("addr");
        assert!(!checker.mac2_ok(&second, initiation::MAC1, elsewhere, t0, &mut rng));
        // Both go stale after two minutes.
        let later = t0 + COOKIE_LIFETIME;
        assert!(jar.cookie(later).is_none());
        assert!(!checker.mac2_ok(&second, initiation::MAC1, src, later, &mut rng), "the secret rotated");
    }

    #[test]
    fn replies_bound_to_another_message_or_from_another_peer_are_refused() {
        let mut rng = rand_core::OsRng;
        let t0 = Instant::now();
        let (a, b) = (Identity::new(StaticSecret::random(&mut rng)), Identity::new(StaticSecret::random(&mut rng)));
        let a_sees_b = PeerKey::new(&a, *b.public(), None);
        let src: SocketAddr = "[2001:db8::1]:4000".parse().expect("addr");
        let mut checker = CookieChecker::new(&b, t0, &mut rng);
        let mut jar = CookieJar::default();
        let ts = tai64n(Duration::from_secs(1));
        let (first, _) = initiate(&a, &a_sees_b, 1, ts, None, &mut rng).expect("initiation");
        let reply = checker.reply(&first, initiation::MAC1, 1, src, t0, &mut rng);
        assert_eq!(jar.receive(&reply, &a_sees_b, t0), Err(CookieError::Unexpected));
        let (other, _) = initiate(&a, &a_sees_b, 2, ts, None, &mut rng).expect("initiation");
        jar.sent(&other, initiation::MAC1);
        assert_eq!(jar.receive(&reply, &a_sees_b, t0), Err(CookieError::Decrypt), "bound to the first");
        let stranger = PeerKey::new(&b, *a.public(), None);
        jar.sent(&first, initiation::MAC1);
        assert_eq!(jar.receive(&reply, &stranger, t0), Err(CookieError::Decrypt), "not the peer's key");
        assert!(jar.cookie(t0).is_none());
    }
}
