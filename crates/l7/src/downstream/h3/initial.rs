//! A server Initial packet that refuses a connection attempt with a
//! CONNECTION_CLOSE, made without a connection: for an Initial whose Retry
//! token is forged, stale or for another address, which RFC 9000 (8.1.2)
//! says to close with INVALID_TOKEN. Building a quiche connection for it
//! would run the TLS handshake (a key share and a signature) for a client
//! that proved nothing; Initial keys come from the connection ID alone
//! (RFC 9001 5.2), so the close costs a few HMACs and one AES-GCM seal.

use boring::symm::{Cipher, Crypter, Mode};

/// QUIC version 1 (RFC 9000), the only one this packet is made for.
pub const VERSION_1: u32 = 1;
/// RFC 9000 20.1.
pub const INVALID_TOKEN: u64 = 0x0b;

/// RFC 9001 5.2: the salt of QUIC version 1's Initial secrets.
const INITIAL_SALT_V1: [u8; 20] = [
    0x38, 0x76, 0x2c, 0xf7, 0xf5, 0x59, 0x34, 0xb3, 0x4d, 0x17, 0x9a, 0xe6, 0xa4, 0xc8, 0x0c, 0xad, 0xcc, 0xbb, 0x7f,
    0x0a,
];

const TAG_LEN: usize = 16;
const SAMPLE_LEN: usize = 16;

/// The server's Initial packet protection keys.
pub struct ServerInitialKeys {
    pub key: [u8; 16],
    pub iv: [u8; 12],
    pub hp: [u8; 16],
}

impl Drop for ServerInitialKeys {
    fn drop(&mut self) {
        use zeroize::Zeroize;
        self.key.zeroize();
        self.iv.zeroize();
        self.hp.zeroize();
    }
}

fn hmac(key: &[u8], data: &[u8]) -> Option<[u8; 32]> {
    boring::hash::hmac_sha256(key, data).ok()
}

/// TLS 1.3's HKDF-Expand-Label with an empty context, for lengths of at
/// most one SHA-256 output (all QUIC's Initial secrets and keys).
fn expand_label<const N: usize>(secret: &[u8], label: &[u8]) -> Option<[u8; N]> {
    const { assert!(N <= 32) };
    let mut info = Vec::with_capacity(4 + 6 + label.len());
    info.extend_from_slice(&(N as u16).to_be_bytes());
    info.push((6 + label.len()) as u8);
    info.extend_from_slice(b"tls13 ");
    info.extend_from_slice(label);
    info.push(0); // context length
    info.push(1); // HKDF-Expand's counter: one block is enough
    let block = hmac(secret, &info)?;
    let mut out = [0u8; N];
    out.copy_from_slice(&block[..N]);
    Some(out)
}

impl ServerInitialKeys {
    /// The keys for the Initial packets of a connection the client opened
    /// to `client_dcid`.
    pub fn new(client_dcid: &[u8]) -> Option<ServerInitialKeys> {
        use zeroize::Zeroize;
        let mut initial = hmac(&INITIAL_SALT_V1, client_dcid)?;
        let mut server: [u8; 32] = expand_label(&initial, b"server in")?;
        let keys = ServerInitialKeys {
            key: expand_label(&server, b"quic key")?,
            iv: expand_label(&server, b"quic iv")?,
            hp: expand_label(&server, b"quic hp")?,
        };
        initial.zeroize();
        server.zeroize();
        Some(keys)
    }
}

fn put_varint(out: &mut Vec<u8>, v: u64) {
    match v {
        0..=63 => out.push(v as u8),
        64..=16383 => out.extend_from_slice(&((v as u16) | 0x4000).to_be_bytes()),
        16384..=1_073_741_823 => out.extend_from_slice(&((v as u32) | 0x8000_0000).to_be_bytes()),
        _ => out.extend_from_slice(&(v | 0xc000_0000_0000_0000).to_be_bytes()),
    }
}

/// A server Initial packet, version 1, carrying a transport
/// CONNECTION_CLOSE with `error` and `reason`, to the client that sent an
/// Initial from `client_scid` to `client_dcid`. `server_scid` is the
/// connection ID the packet says it comes from. None if the packet cannot
/// be made (a connection ID over 20 bytes, or BoringSSL refusing).
pub fn close_packet(
    client_dcid: &[u8],
    client_scid: &[u8],
    server_scid: &[u8],
    error: u64,
    reason: &[u8],
) -> Option<Vec<u8>> {
    if client_dcid.len() > 20 || client_scid.len() > 20 || server_scid.len() > 20 || reason.len() > 64 {
        return None;
    }
    let keys = ServerInitialKeys::new(client_dcid)?;
    let mut payload = Vec::with_capacity(16 + reason.len());
    payload.push(0x1c); // CONNECTION_CLOSE, transport
    put_varint(&mut payload, error);
    put_varint(&mut payload, 0); // frame type: none in particular
    put_varint(&mut payload, reason.len() as u64);
    payload.extend_from_slice(reason);
    // Header protection samples 16 bytes from 4 bytes past the packet
    // number's start, and the AEAD tag gives 16: PADDING makes up the
    // rest if the frame is shorter.
    let pn_len = 1;
    while pn_len + payload.len() + TAG_LEN < 4 + SAMPLE_LEN {
        payload.push(0);
    }

    // Long header: Initial, packet number length 1 (encoded as 0).
    let mut pkt = Vec::with_capacity(64 + payload.len());
    pkt.push(0xc0);
    pkt.extend_from_slice(&VERSION_1.to_be_bytes());
    pkt.push(client_scid.len() as u8);
    pkt.extend_from_slice(client_scid);
    pkt.push(server_scid.len() as u8);
    pkt.extend_from_slice(server_scid);
    put_varint(&mut pkt, 0); // no token
    // Length: 2-byte varint always, so the header's size is known.
    let length = (pn_len + payload.len() + TAG_LEN) as u16;
    pkt.extend_from_slice(&(length | 0x4000).to_be_bytes());
    let pn_offset = pkt.len();
    pkt.push(0); // packet number 0

    // Packet number 0: the nonce is the IV itself.
    let mut tag = [0u8; TAG_LEN];
    let sealed =
        boring::symm::encrypt_aead(Cipher::aes_128_gcm(), &keys.key, Some(&keys.iv), &pkt, &payload, &mut tag).ok()?;
    pkt.extend_from_slice(&sealed);
    pkt.extend_from_slice(&tag);

    let sample_at = pn_offset + 4;
    let mask = hp_mask(&keys.hp, pkt.get(sample_at..sample_at + SAMPLE_LEN)?)?;
    pkt[0] ^= mask[0] & 0x0f;
    pkt[pn_offset] ^= mask[1];
    Some(pkt)
}

/// AES-128-ECB of the sample: the header protection mask (RFC 9001 5.4.3).
fn hp_mask(hp: &[u8; 16], sample: &[u8]) -> Option<[u8; 16]> {
    let mut c = Crypter::new(Cipher::aes_128_ecb(), Mode::Encrypt, hp, None).ok()?;
    c.pad(false);
    let mut out = [0u8; 32];
    let n = c.update(sample, &mut out).ok()?;
    if n < 16 {
        return None;
    }
    let mut mask = [0u8; 16];
    mask.copy_from_slice(&out[..16]);
    Some(mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
    }

    /// RFC 9001 A.1: the keys of the client's first Initial, DCID
    /// 0x8394c8f03e515708.
    #[test]
    fn server_initial_keys_match_rfc_9001_appendix_a() {
        let k = ServerInitialKeys::new(&hex("8394c8f03e515708")).expect("keys");
        assert_eq!(k.key.to_vec(), hex("cf3a5331653c364c88f0f379b6067e37"));
        assert_eq!(k.iv.to_vec(), hex("0ac1493ca1905853b0bba03e"));
        assert_eq!(k.hp.to_vec(), hex("c206b8d9b9f0f37644430b490eeaa314"));
    }

    /// RFC 9001 A.2/A.3 header protection: the server's sample and mask.
    #[test]
    fn header_protection_mask_matches_rfc_9001_appendix_a() {
        let k = ServerInitialKeys::new(&hex("8394c8f03e515708")).expect("keys");
        let mask = hp_mask(&k.hp, &hex("2cd0991cd25b0aac406a5816b6394100")).expect("mask");
        assert_eq!(mask[..5].to_vec(), hex("2ec0d8356a"));
    }

    /// The packet opens with the keys a client derives, and says
    /// INVALID_TOKEN.
    #[test]
    fn a_close_packet_opens_with_the_clients_keys() {
        let dcid = hex("0011223344556677");
        let pkt =
            close_packet(&dcid, &hex("aabbcc"), &hex("0102030405060708"), INVALID_TOKEN, b"bad token").expect("packet");
        let k = ServerInitialKeys::new(&dcid).expect("keys");
        // Header: 1 + 4 + 1+3 + 1+8 + 1 (token) + 2 (length), then the PN.
        let pn_offset = 1 + 4 + 4 + 9 + 1 + 2;
        let mask = hp_mask(&k.hp, &pkt[pn_offset + 4..pn_offset + 20]).expect("mask");
        let mut header = pkt[..=pn_offset].to_vec();
        header[0] ^= mask[0] & 0x0f;
        header[pn_offset] ^= mask[1];
        assert_eq!(header[0], 0xc0, "Initial, 1-byte packet number");
        assert_eq!(header[pn_offset], 0);
        let length = u16::from_be_bytes([pkt[pn_offset - 2], pkt[pn_offset - 1]]) & 0x3fff;
        assert_eq!(length as usize, pkt.len() - pn_offset);
        let body = &pkt[pn_offset + 1..pkt.len() - 16];
        let tag = &pkt[pkt.len() - 16..];
        let plain = boring::symm::decrypt_aead(Cipher::aes_128_gcm(), &k.key, Some(&k.iv), &header, body, tag)
            .expect("the packet opens");
        assert_eq!(&plain[..4], &[0x1c, 0x0b, 0x00, 9]);
        assert_eq!(&plain[4..13], b"bad token");
        assert!(plain[13..].iter().all(|&b| b == 0), "the rest is PADDING");
    }

    #[test]
    fn oversized_connection_ids_make_no_packet() {
        assert!(close_packet(&[0; 21], &[1], &[2], INVALID_TOKEN, b"").is_none());
    }
}
