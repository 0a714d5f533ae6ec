//! Reading a fuzzer's bytes as choices: numbers that steer a target (where
//! to split a stream, which action a driver takes) and the pieces it feeds
//! to a parser. An exhausted input reads as zeros and empty slices, so
//! every byte string is a valid input.

/// A cursor over the fuzzer's bytes.
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Input { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// What is left, taken whole.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }

    pub fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.byte(), self.byte()])
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    /// Up to `n` bytes.
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.data.split_at(n.min(self.data.len()));
        self.data = rest;
        head
    }

    /// A piece whose length the next byte gives (0–255).
    pub fn piece(&mut self) -> &'a [u8] {
        let n = usize::from(self.byte());
        self.take(n)
    }
}

/// Split points for a stream of `len` bytes, read from `choices`: the
/// stream arrives in these pieces (none empty but possibly the last).
pub fn splits(choices: &[u8], len: usize) -> Vec<usize> {
    let mut at = 0;
    let mut cuts = Vec::new();
    for &c in choices {
        at += usize::from(c) + 1;
        if at >= len {
            break;
        }
        cuts.push(at);
    }
    cuts.push(len);
    cuts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exhausted_input_reads_as_zeros() {
        let mut i = Input::new(&[1, 2, 3]);
        assert_eq!(i.u16(), 0x0102);
        assert_eq!(i.u32(), 0x0300_0000);
        assert!(i.is_empty());
        assert_eq!(i.piece(), b"");
    }

    #[test]
    fn splits_cover_the_stream() {
        assert_eq!(splits(&[0, 2, 200], 10), vec![1, 4, 10]);
        assert_eq!(splits(&[], 5), vec![5]);
        assert_eq!(splits(&[9], 0), vec![0]);
    }
}
