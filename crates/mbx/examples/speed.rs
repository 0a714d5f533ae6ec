use boring::rsa::Rsa;
use gatehouse_mbx::*;
use std::time::Instant;
fn main() {
    let sizes: Vec<u32> = std::env::args().skip(1).map(|a| a.parse().unwrap()).collect();
    let sizes = if sizes.is_empty() { vec![2048, 3072, 4096] } else { sizes };
    for bits in sizes {
        let rsa = Rsa::generate(bits).unwrap();
        let part = |b: Option<&boring::bn::BigNumRef>| b.unwrap().to_vec();
        let (p, q) = (part(rsa.p()), part(rsa.q()));
        let (dp, dq, qinv) = (part(rsa.dmp1()), part(rsa.dmq1()), part(rsa.iqmp()));
        let (n, e) = (rsa.n().to_vec(), rsa.e().to_vec());
        let key = RsaKey::new(&Components { n: &n, e: &e, p: &p, q: &q, dp: &dp, dq: &dq, qinv: &qinv }).unwrap();
        let size = key.size();
        let inputs: Vec<Vec<u8>> = (0..8).map(|i| { let mut v = vec![0x11u8 + i; size]; v[0] = 0; v }).collect();
        let mut outs = vec![vec![0u8; size]; 8];
        let t = Instant::now();
        let mut done = 0;
        while t.elapsed().as_secs_f64() < 2.0 {
            let mut ops: Vec<Op> = inputs.iter().zip(outs.iter_mut()).map(|(i, o)| Op { key: &key, input: i, output: o }).collect();
            let r = private_batch(&mut ops);
            assert!(r.iter().all(|x| x.is_ok()));
            done += 8;
        }
        println!("mb rsa{bits} {:.0} ops/s", done as f64 / t.elapsed().as_secs_f64());
    }
}
