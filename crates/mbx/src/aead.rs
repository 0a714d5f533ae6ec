//! ChaCha20-Poly1305 (RFC 8439 section 2.8) across packets, as WireGuard
//! seals and opens them: each packet its own 32-byte key and 64-bit
//! counter (the nonce is four zero bytes and the counter, little-endian),
//! the associated data empty. One batch mixes keys and lengths. The
//! one-time Poly1305 keys and the keystreams come from the sixteen-lane
//! ChaCha20, the tags from the eight-lane Poly1305; on a CPU without
//! AVX-512 IFMA, from their AVX2 twins (eight and four lanes). Where the
//! CPU has neither, and for the few packets after the last full group when
//! one at a time costs less than a part-empty group, BoringSSL seals and
//! opens them one by one.

use boring::aead::{AeadCtx, Algorithm};

use crate::chacha::avx2::LANES as AVX2_LANES;
use crate::chacha::{CHACHA_LANES, ChaChaJob, chacha20_xor_batch, group_lanes};
use crate::poly1305::{Input, PolyJob, poly1305_batch};

/// Bytes of a tag.
pub const TAG_LEN: usize = 16;

/// One packet to seal in place.
pub struct SealJob<'a> {
    pub key: &'a [u8; 32],
    pub counter: u64,
    /// The plaintext, replaced by the ciphertext.
    pub data: &'a mut [u8],
    pub tag: &'a mut [u8; TAG_LEN],
}

/// One packet to open in place.
pub struct OpenJob<'a> {
    pub key: &'a [u8; 32],
    pub counter: u64,
    /// The ciphertext, replaced by the plaintext when the tag holds.
    pub data: &'a mut [u8],
    pub tag: &'a [u8; TAG_LEN],
    /// Set by [`open_batch`].
    pub ok: bool,
}

fn nonce(counter: u64) -> [u8; 12] {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_le_bytes());
    n
}

/// The one-time Poly1305 keys: the first 32 bytes of block 0 of each
/// packet's keystream.
fn one_time_keys(keys: &[(&[u8; 32], [u8; 12])]) -> Vec<[u8; 64]> {
    let mut blocks = vec![[0u8; 64]; keys.len()];
    let mut jobs: Vec<ChaChaJob<'_>> =
        blocks.iter_mut().zip(keys).map(|(b, (key, nonce))| ChaChaJob { key, nonce, counter: 0, data: b }).collect();
    chacha20_xor_batch(&mut jobs);
    blocks
}

fn otk(block: &[u8; 64]) -> [u8; 32] {
    let mut k = [0u8; 32];
    k.copy_from_slice(&block[..32]);
    k
}

/// What a part-empty group of sixteen lanes costs against packets one at
/// a time, in nanoseconds on Zen 5 (`gatehouse bench wg-crypto`): a group
/// about 500 + 3.2 per byte of its longest packet; BoringSSL about 170 +
/// 0.36 per byte for each packet. The ratio holds within a factor of two on
/// Zen 4 (its IFMA is half as fast, and so is the group's slope).
/// Measured before a part-empty group cut its packets' keystreams across
/// the idle ChaCha20 lanes and spread a long packet's Poly1305 blocks
/// across the lanes, which made such groups cheaper (eight 1,420-byte
/// packets 1.3–1.5× the rate on an Intel Xeon, family 6 model 207): the
/// rule now errs towards BoringSSL, which there costs about what a group
/// of four 1,420-byte packets does.
fn one_by_one_is_cheaper(lens: impl Iterator<Item = usize> + Clone) -> bool {
    let longest = lens.clone().max().unwrap_or(0) as u64;
    let group = 500 + longest * 16 / 5;
    let single: u64 = lens.map(|l| 170 + l as u64 * 36 / 100).sum();
    single < group
}

/// The same for a group of eight AVX2 lanes, measured on Zen 3 (`gatehouse
/// bench wg-crypto`, nanoseconds): the group about 300 + 100 a packet +
/// 5.2 per byte of the longest + 0.18 per byte of each; BoringSSL (its own
/// AVX2 code) about 230 + 0.7 per byte a packet. The lanes win on small
/// packets (1.7× at 64 bytes, 1.1–1.3× at 256, a full group) and lose on
/// large ones (0.9× at 1420), where one packet's blocks already fill
/// BoringSSL's vectors.
fn avx2_group_is_cheaper(lens: impl Iterator<Item = usize> + Clone) -> bool {
    let (n, longest, sum) = lens.fold((0u64, 0u64, 0u64), |(n, m, s), l| (n + 1, m.max(l as u64), s + l as u64));
    let group = 300 + 100 * n + longest * 26 / 5 + sum * 18 / 100;
    let single = 230 * n + sum * 7 / 10;
    group < single
}

/// The longest packet the AVX2 lanes take: past it, a full group of
/// packets this long costs more than BoringSSL one by one.
const AVX2_LANE_MAX: usize = 640;

/// Packets per group the AEAD forms on this CPU: sixteen with IFMA, where
/// the costs above were measured; eight on any other CPU with AVX2 (an
/// AVX-512 CPU without IFMA too: its ChaCha20 then runs in the sixteen-lane
/// kernel, its Poly1305 in AVX2); none without AVX2.
fn lanes() -> usize {
    if crate::poly1305::ifma_available() {
        CHACHA_LANES
    } else if group_lanes() > 0 {
        AVX2_LANES
    } else {
        0
    }
}

/// What seals and opens packets on this CPU, for logs and benchmarks.
pub fn engine() -> &'static str {
    match (lanes(), group_lanes()) {
        (CHACHA_LANES, _) => "ChaCha20 in 16 AVX-512 lanes, Poly1305 in 8 IFMA lanes",
        // The limit is AVX2_LANE_MAX.
        (AVX2_LANES, CHACHA_LANES) => {
            "ChaCha20 in 16 AVX-512 lanes and Poly1305 in 4 AVX2 lanes for packets up to 640 bytes, BoringSSL above"
        }
        (AVX2_LANES, _) => "ChaCha20 in 8 AVX2 lanes and Poly1305 in 4 for packets up to 640 bytes, BoringSSL above",
        _ => "BoringSSL, one packet at a time",
    }
}

/// Seals every packet: encrypts in place from block 1 and writes its tag.
pub fn seal_batch(jobs: &mut [SealJob<'_>]) {
    match lanes() {
        CHACHA_LANES => seal_wide(jobs),
        AVX2_LANES => seal_avx2(jobs),
        _ => seal_one_by_one(jobs),
    }
}

/// Sixteen lanes: every full group, then the rest in a part-empty group
/// or one by one, whichever costs less.
fn seal_wide(jobs: &mut [SealJob<'_>]) {
    let mut chunks = jobs.chunks_exact_mut(CHACHA_LANES);
    for group in chunks.by_ref() {
        seal_group::<CHACHA_LANES>(group);
    }
    let rest = chunks.into_remainder();
    if one_by_one_is_cheaper(rest.iter().map(|j| j.data.len())) {
        seal_one_by_one(rest);
    } else {
        seal_group::<CHACHA_LANES>(rest);
    }
}

/// Eight AVX2 lanes: small packets in groups where a group costs less,
/// everything else by BoringSSL.
fn seal_avx2(jobs: &mut [SealJob<'_>]) {
    let mut cache = None;
    let mut small: Vec<SealJob<'_>> = Vec::with_capacity(jobs.len());
    for j in jobs.iter_mut() {
        if j.data.len() <= AVX2_LANE_MAX {
            small.push(SealJob { key: j.key, counter: j.counter, data: &mut *j.data, tag: &mut *j.tag });
        } else {
            seal_one(&mut cache, j);
        }
    }
    for group in small.chunks_mut(AVX2_LANES) {
        if avx2_group_is_cheaper(group.iter().map(|j| j.data.len())) {
            seal_group::<AVX2_LANES>(group);
        } else {
            group.iter_mut().for_each(|j| seal_one(&mut cache, j));
        }
    }
    forget(&mut cache);
}

/// A BoringSSL context for `key`, made again only when the key changes
/// (packets to one peer share theirs).
fn context<'c>(cache: &'c mut Option<([u8; 32], AeadCtx)>, key: &[u8; 32]) -> Option<&'c mut AeadCtx> {
    if cache.as_ref().is_none_or(|(k, _)| k != key) {
        *cache = None;
        let ctx = AeadCtx::new_default_tag(&Algorithm::chacha20_poly1305(), key).ok()?;
        *cache = Some((*key, ctx));
    }
    cache.as_mut().map(|(_, c)| c)
}

/// Forgets a cached key.
fn forget(cache: &mut Option<([u8; 32], AeadCtx)>) {
    if let Some((k, _)) = cache.as_mut() {
        zeroize::Zeroize::zeroize(k);
    }
    *cache = None;
}

fn seal_one(cache: &mut Option<([u8; 32], AeadCtx)>, j: &mut SealJob<'_>) {
    if let Some(ctx) = context(cache, j.key) {
        // Sealing cannot fail for these sizes and this algorithm.
        let _ = ctx.seal_in_place_mut(&nonce(j.counter), j.data, &mut j.tag[..], &[]);
    }
}

fn seal_one_by_one(jobs: &mut [SealJob<'_>]) {
    let mut cache = None;
    jobs.iter_mut().for_each(|j| seal_one(&mut cache, j));
    forget(&mut cache);
}

fn open_one(cache: &mut Option<([u8; 32], AeadCtx)>, j: &mut OpenJob<'_>) {
    j.ok = context(cache, j.key)
        .is_some_and(|ctx| ctx.open_gather_mut(&nonce(j.counter), j.data, &j.tag[..], &[]).is_ok());
}

fn open_one_by_one(jobs: &mut [OpenJob<'_>]) {
    let mut cache = None;
    jobs.iter_mut().for_each(|j| open_one(&mut cache, j));
    forget(&mut cache);
}

/// What an idle slot of a part-filled group holds; never read.
static IDLE_KEY: [u8; 32] = [0; 32];

/// The one-time Poly1305 keys of up to `G` packets (`keys[..n]`), from
/// block 0 of each keystream.
fn group_otks<const G: usize>(keys: [&[u8; 32]; G], nonces: &[[u8; 12]; G], n: usize) -> [[u8; 32]; G] {
    let mut blocks = [[0u8; 64]; G];
    let mut i = 0;
    let mut ks: [ChaChaJob<'_>; G] = blocks.each_mut().map(|b| {
        let job = ChaChaJob { key: keys[i], nonce: &nonces[i], counter: 0, data: b };
        i += 1;
        job
    });
    chacha20_xor_batch(&mut ks[..n]);
    std::array::from_fn(|i| otk(&blocks[i]))
}

/// Up to `G` packets (a group of the ChaCha20 lanes), everything on the
/// stack: arrays of `G` slots, the kernels given the filled ones.
fn seal_group<const G: usize>(jobs: &mut [SealJob<'_>]) {
    let n = jobs.len().min(G);
    let jobs = &mut jobs[..n];
    let nonces: [[u8; 12]; G] = std::array::from_fn(|i| jobs.get(i).map_or([0; 12], |j| nonce(j.counter)));
    let otks = group_otks(std::array::from_fn(|i| jobs.get(i).map_or(&IDLE_KEY, |j| j.key)), &nonces, n);
    {
        let mut it = jobs.iter_mut();
        let mut xor: [ChaChaJob<'_>; G] = std::array::from_fn(|i| match it.next() {
            Some(j) => ChaChaJob { key: j.key, nonce: &nonces[i], counter: 1, data: &mut *j.data },
            None => ChaChaJob { key: &IDLE_KEY, nonce: &nonces[i], counter: 1, data: &mut [] },
        });
        chacha20_xor_batch(&mut xor[..n]);
    }
    let mut idle = [[0u8; TAG_LEN]; G];
    let mut it = jobs.iter_mut().zip(&otks);
    let mut mac: [PolyJob<'_>; G] = idle.each_mut().map(|spare| match it.next() {
        Some((j, k)) => PolyJob { key: k, input: Input::Aead { aad: &[], ct: &*j.data }, tag: &mut *j.tag },
        None => PolyJob { key: &IDLE_KEY, input: Input::Raw(&[]), tag: spare },
    });
    poly1305_batch(&mut mac[..n]);
}

/// Opens up to `G` packets as [`seal_group`] seals them: the tags first,
/// then the keystream only into the packets whose tag holds.
fn open_group<const G: usize>(jobs: &mut [OpenJob<'_>]) {
    let n = jobs.len().min(G);
    let jobs = &mut jobs[..n];
    let nonces: [[u8; 12]; G] = std::array::from_fn(|i| jobs.get(i).map_or([0; 12], |j| nonce(j.counter)));
    let otks = group_otks(std::array::from_fn(|i| jobs.get(i).map_or(&IDLE_KEY, |j| j.key)), &nonces, n);
    let mut tags = [[0u8; TAG_LEN]; G];
    {
        let mut it = jobs.iter().zip(&otks);
        let mut mac: [PolyJob<'_>; G] = tags.each_mut().map(|tag| match it.next() {
            Some((j, k)) => PolyJob { key: k, input: Input::Aead { aad: &[], ct: &*j.data }, tag },
            None => PolyJob { key: &IDLE_KEY, input: Input::Raw(&[]), tag },
        });
        poly1305_batch(&mut mac[..n]);
    }
    for (j, t) in jobs.iter_mut().zip(&tags) {
        // Constant time: every byte compared, differences or-ed together.
        j.ok = t.iter().zip(j.tag).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
    }
    let mut it = jobs.iter_mut();
    let mut xor: [ChaChaJob<'_>; G] = std::array::from_fn(|i| match it.next() {
        // A packet whose tag fails is left as it came.
        Some(j) if j.ok => ChaChaJob { key: j.key, nonce: &nonces[i], counter: 1, data: &mut *j.data },
        _ => ChaChaJob { key: &IDLE_KEY, nonce: &nonces[i], counter: 1, data: &mut [] },
    });
    chacha20_xor_batch(&mut xor[..n]);
}

/// Opens every packet whose tag holds (decrypting it in place); `ok` says
/// which. A packet whose tag fails never shows its plaintext: it is left
/// as it came (batched) or zeroed (one by one).
pub fn open_batch(jobs: &mut [OpenJob<'_>]) {
    match lanes() {
        CHACHA_LANES => open_wide(jobs),
        AVX2_LANES => open_avx2(jobs),
        _ => open_one_by_one(jobs),
    }
}

fn open_wide(jobs: &mut [OpenJob<'_>]) {
    let full = jobs.len() / CHACHA_LANES * CHACHA_LANES;
    let (groups, rest) = jobs.split_at_mut(full);
    if !rest.is_empty() && one_by_one_is_cheaper(rest.iter().map(|j| j.data.len())) {
        open_one_by_one(rest);
        open_batched(groups);
    } else {
        open_batched(jobs);
    }
}

/// As [`seal_avx2`]: small packets in groups where a group costs less.
fn open_avx2(jobs: &mut [OpenJob<'_>]) {
    let mut cache = None;
    let mut small: Vec<OpenJob<'_>> = Vec::with_capacity(jobs.len());
    let mut verdicts: Vec<&mut bool> = Vec::with_capacity(jobs.len());
    for j in jobs.iter_mut() {
        if j.data.len() <= AVX2_LANE_MAX {
            let OpenJob { key, counter, data, tag, ok } = j;
            small.push(OpenJob { key, counter: *counter, data, tag, ok: false });
            verdicts.push(ok);
        } else {
            open_one(&mut cache, j);
        }
    }
    for group in small.chunks_mut(AVX2_LANES) {
        if avx2_group_is_cheaper(group.iter().map(|j| j.data.len())) {
            open_group::<AVX2_LANES>(group);
        } else {
            group.iter_mut().for_each(|j| open_one(&mut cache, j));
        }
    }
    forget(&mut cache);
    for (j, ok) in small.iter().zip(verdicts) {
        *ok = j.ok;
    }
}

fn open_batched(jobs: &mut [OpenJob<'_>]) {
    if jobs.is_empty() {
        return;
    }
    let nonces: Vec<[u8; 12]> = jobs.iter().map(|j| nonce(j.counter)).collect();
    let keys: Vec<(&[u8; 32], [u8; 12])> = jobs.iter().zip(&nonces).map(|(j, n)| (j.key, *n)).collect();
    let otks: Vec<[u8; 32]> = one_time_keys(&keys).iter().map(otk).collect();
    let mut tags = vec![[0u8; TAG_LEN]; jobs.len()];
    {
        let mut mac: Vec<PolyJob<'_>> = jobs
            .iter()
            .zip(&otks)
            .zip(tags.iter_mut())
            .map(|((j, k), t)| PolyJob { key: k, input: Input::Aead { aad: &[], ct: &*j.data }, tag: t })
            .collect();
        poly1305_batch(&mut mac);
    }
    for (j, t) in jobs.iter_mut().zip(&tags) {
        // Constant time: every byte compared, differences or-ed together.
        j.ok = t.iter().zip(j.tag).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
    }
    let mut xor: Vec<ChaChaJob<'_>> = jobs
        .iter_mut()
        .zip(&nonces)
        .filter(|(j, _)| j.ok)
        .map(|(j, n)| ChaChaJob { key: j.key, nonce: n, counter: 1, data: &mut *j.data })
        .collect();
    chacha20_xor_batch(&mut xor);
}

#[cfg(test)]
mod tests {
    use super::*;
    use boring::aead::{AeadCtx, Algorithm};

    fn boring_seal(key: &[u8; 32], counter: u64, data: &mut [u8]) -> [u8; 16] {
        let alg = Algorithm::chacha20_poly1305();
        let mut ctx = AeadCtx::new_default_tag(&alg, key).expect("key");
        let mut tag = [0u8; 16];
        ctx.seal_in_place_mut(&nonce(counter), data, &mut tag, &[]).expect("seals");
        tag
    }

    #[test]
    fn batches_seal_as_boringssl_does_and_open_back() {
        let mut rng = fastrand::Rng::with_seed(0xaead);
        for round in 0..120 {
            let n = rng.usize(1..=40);
            let keys: Vec<[u8; 32]> = (0..n).map(|_| std::array::from_fn(|_| rng.u8(..))).collect();
            let counters: Vec<u64> = (0..n).map(|_| rng.u64(..)).collect();
            // Half the rounds small packets only, which the AVX2 lanes take.
            let longest = if round % 2 == 0 { 2048 } else { 700 };
            let plain: Vec<Vec<u8>> =
                (0..n).map(|_| (0..rng.usize(0..=longest)).map(|_| rng.u8(..)).collect()).collect();
            let mut data = plain.clone();
            let mut tags = vec![[0u8; 16]; n];
            let mut jobs: Vec<SealJob<'_>> = data
                .iter_mut()
                .zip(tags.iter_mut())
                .enumerate()
                .map(|(i, (d, t))| SealJob { key: &keys[i], counter: counters[i], data: d, tag: t })
                .collect();
            seal_batch(&mut jobs);
            for i in 0..n {
                let mut want = plain[i].clone();
                let tag = boring_seal(&keys[i], counters[i], &mut want);
                assert_eq!((&data[i], &tags[i]), (&want, &tag), "round {round}, packet {i}");
            }
            // Open them back, with some tampered.
            let bad: Vec<bool> = (0..n).map(|_| rng.u8(..4) == 0).collect();
            let mut tampered_tags = tags.clone();
            for i in 0..n {
                if bad[i] {
                    tampered_tags[i][rng.usize(..16)] ^= 1 << rng.u8(..8);
                }
            }
            let sealed = data.clone();
            let mut jobs: Vec<OpenJob<'_>> = data
                .iter_mut()
                .enumerate()
                .map(|(i, d)| OpenJob {
                    key: &keys[i],
                    counter: counters[i],
                    data: d,
                    tag: &tampered_tags[i],
                    ok: false,
                })
                .collect();
            open_batch(&mut jobs);
            let oks: Vec<bool> = jobs.iter().map(|j| j.ok).collect();
            for i in 0..n {
                assert_eq!(oks[i], !bad[i], "round {round}, packet {i}");
                if bad[i] {
                    let zeroed = vec![0u8; sealed[i].len()];
                    assert!(data[i] == sealed[i] || data[i] == zeroed, "round {round}, packet {i}: plaintext shown");
                } else {
                    assert_eq!(data[i], plain[i]);
                }
            }
        }
    }
}
