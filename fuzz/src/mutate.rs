//! Bounded mutation without coverage feedback, for `make test`: the
//! mutations AFL++ starts with (bit flips, edge values, truncation,
//! growth, splices of two inputs), on a fixed seed so that a failure
//! repeats. Coverage-guided runs (`make fuzz`) go much further; this
//! keeps every target exercised on every test run.

/// One mutant of an input picked from `seeds`.
pub fn mutate(rng: &mut fastrand::Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut d = seeds[rng.usize(..seeds.len())].clone();
    for _ in 0..rng.usize(1..5) {
        match rng.u8(..8) {
            0 | 1 if !d.is_empty() => {
                let at = rng.usize(..d.len());
                d[at] ^= 1 << rng.u8(..8);
            }
            2 if !d.is_empty() => {
                let at = rng.usize(..d.len());
                d[at] = [0, 1, 0x7f, 0x80, 0xff, b'\r', b'\n', b':'][rng.usize(..8)];
            }
            3 if d.len() > 1 => {
                // A 16-bit field (a length, a port, a window) at an edge.
                let at = rng.usize(..d.len() - 1);
                let v: u16 = [0, 1, 7, 8, 0x7fff, 0xffff, d.len() as u16][rng.usize(..7)];
                d[at..at + 2].copy_from_slice(&v.to_be_bytes());
            }
            4 => d.truncate(rng.usize(..=d.len())),
            5 => d.extend((0..rng.usize(1..48)).map(|_| rng.u8(..))),
            6 => {
                let other = &seeds[rng.usize(..seeds.len())];
                let cut = rng.usize(..=d.len());
                let from = rng.usize(..=other.len());
                d.truncate(cut);
                d.extend_from_slice(&other[from..]);
            }
            _ => {
                // A piece repeated: the shape of floods.
                if !d.is_empty() {
                    let a = rng.usize(..d.len());
                    let b = rng.usize(a..=d.len().min(a + 64));
                    let piece = d[a..b].to_vec();
                    for _ in 0..rng.usize(1..8) {
                        d.splice(b..b, piece.iter().copied());
                    }
                }
            }
        }
    }
    d
}
