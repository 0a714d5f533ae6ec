//! Big-endian (network order) fields read and written at a byte offset.
//! The offsets come from [`crate::field`]; callers have checked that the
//! header is whole, so these index directly and panic on a short slice,
//! which would be a bug in the caller's length check, not bad input.

#[inline(always)]
pub fn get16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

#[inline(always)]
pub fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

#[inline(always)]
pub fn get32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline(always)]
pub fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_in_network_order() {
        let mut b = [0u8; 8];
        put16(&mut b, 1, 0x1234);
        put32(&mut b, 3, 0xdead_beef);
        assert_eq!(b, [0, 0x12, 0x34, 0xde, 0xad, 0xbe, 0xef, 0]);
        assert_eq!(get16(&b, 1), 0x1234);
        assert_eq!(get32(&b, 3), 0xdead_beef);
    }
}
