//! Extensible priorities (RFC 9218): a request's urgency (0, first, to 7)
//! and whether its response may be sent a piece at a time beside others
//! of the same urgency, from the request's `priority` field or a later
//! PRIORITY_UPDATE frame. Browsers set them (a page before its images);
//! quiche's scheduler carries them out.

/// A response's priority; the default is RFC 9218's (urgency 3, not
/// incremental).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Priority {
    pub urgency: u8,
    pub incremental: bool,
}

impl Default for Priority {
    fn default() -> Self {
        Priority { urgency: 3, incremental: false }
    }
}

impl Priority {
    /// A `priority` field value (a Structured Fields dictionary, RFC 8941)
    /// applied over `self`: `u` an integer 0 to 7, `i` a boolean (bare
    /// means true). Members and parameters it does not know, and values
    /// out of range or of the wrong type, are ignored (RFC 9218 4); so is
    /// a value that is not a dictionary at all.
    pub fn with_field(mut self, value: &[u8]) -> Priority {
        for member in value.split(|&b| b == b',') {
            // Parameters (after ';') mean nothing to either key.
            let member = member.split(|&b| b == b';').next().unwrap_or_default().trim_ascii();
            let (key, v) = match member.iter().position(|&b| b == b'=') {
                Some(at) => (&member[..at], Some(&member[at + 1..])),
                None => (member, None),
            };
            match (key, v) {
                (b"u", Some([d @ b'0'..=b'7'])) => self.urgency = d - b'0',
                (b"i", None | Some(b"?1")) => self.incremental = true,
                (b"i", Some(b"?0")) => self.incremental = false,
                _ => {}
            }
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(v: &str) -> Priority {
        Priority::default().with_field(v.as_bytes())
    }

    #[test]
    fn urgency_and_incremental_come_from_the_field() {
        assert_eq!(p(""), Priority { urgency: 3, incremental: false });
        assert_eq!(p("u=0, i"), Priority { urgency: 0, incremental: true });
        assert_eq!(p("u=5"), Priority { urgency: 5, incremental: false });
        assert_eq!(p("i=?1,u=1"), Priority { urgency: 1, incremental: true });
        assert_eq!(p("u=1, i=?0"), Priority { urgency: 1, incremental: false });
        assert_eq!(p("u=2;x=1, i;y"), Priority { urgency: 2, incremental: true });
    }

    #[test]
    fn what_is_unknown_or_out_of_range_is_ignored() {
        assert_eq!(p("u=8"), Priority::default());
        assert_eq!(p("u=-1, i=1, x=3"), Priority::default());
        assert_eq!(p("u=10"), Priority::default());
        assert_eq!(p("U=1"), Priority::default());
        assert_eq!(p("garbage\u{7f}"), Priority::default());
        // A later member wins, as a dictionary's last value does.
        assert_eq!(p("u=1, u=6"), Priority { urgency: 6, incremental: false });
        // An update applies over what the request said.
        let from_request = p("u=1, i");
        assert_eq!(from_request.with_field(b"u=4"), Priority { urgency: 4, incremental: true });
    }
}
