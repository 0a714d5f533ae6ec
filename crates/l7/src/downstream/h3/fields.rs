//! Heads as HTTP/3 carries them: response fields without the
//! connection-specific ones (RFC 9114 4.2), and the room a head needs on
//! its stream before it is worth encoding. The fields are lent to quiche
//! as they are in the header map (quiche's owned `Header` would copy each
//! name and value into vectors of their own, two allocations a field).

use http::{HeaderMap, StatusCode};
use quiche::h3::HeaderRef;

use crate::h1::hop_by_hop_name;
use crate::h2::CONNECTION_SPECIFIC;

/// Room a response head needs on its stream before it is worth encoding:
/// its fields' length (QPACK makes it shorter), capped so that a large
/// head is still tried (quiche then says whether it fits).
pub(super) fn head_size_hint(headers: &HeaderMap) -> usize {
    let fields: usize = headers.iter().map(|(n, v)| n.as_str().len() + v.len() + 2).sum();
    (fields + 8).min(1024)
}

pub(super) fn response_head<'a>(status: &'a StatusCode, headers: &'a HeaderMap) -> Vec<HeaderRef<'a>> {
    let mut out = Vec::with_capacity(headers.len() + 1);
    out.push(HeaderRef::new(b":status", status.as_str().as_bytes()));
    out.extend(fields(headers));
    out
}

pub(super) fn fields_of(headers: &HeaderMap) -> Vec<HeaderRef<'_>> {
    fields(headers).collect()
}

/// A header map's fields as HTTP/3 carries them: without the
/// connection-specific ones (RFC 9114 4.2).
fn fields(headers: &HeaderMap) -> impl Iterator<Item = HeaderRef<'_>> + '_ {
    headers
        .iter()
        .filter(|(name, _)| hop_by_hop_name(name.as_str().as_bytes()) & CONNECTION_SPECIFIC == 0)
        .map(|(name, value)| HeaderRef::new(name.as_str().as_bytes(), value.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_is_encoded_only_with_room_for_it() {
        let mut h = HeaderMap::new();
        h.insert("content-type", http::HeaderValue::from_static("text/plain"));
        assert_eq!(head_size_hint(&h), "content-type".len() + "text/plain".len() + 2 + 8);
        h.insert("x-big", http::HeaderValue::from_str(&"a".repeat(5000)).expect("value"));
        assert_eq!(head_size_hint(&h), 1024);
    }
}
