//! Typed decoding of a YAML [`Node`] tree that keeps going after an error.
//!
//! serde stops at the first mistake; a user fixing a config wants all of them
//! at once. Every decoder here records what was wrong at which field path and
//! returns a fallback, so one pass finds every error in the file.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::yaml::{Node, Value};

/// One problem found in a config: the dotted field path, what was expected,
/// and the line it was found on when known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub path: String,
    pub message: String,
    pub line: Option<usize>,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() { "(document)" } else { &self.path };
        write!(f, "{}: {}", path, self.message)?;
        if let Some(line) = self.line {
            write!(f, " (line {line})")?;
        }
        Ok(())
    }
}

/// Collects errors while decoding; paths are built as the decoder descends.
#[derive(Debug, Default)]
pub struct Ctx {
    path: Vec<String>,
    pub errors: Vec<FieldError>,
    /// The routes, upstreams and certificates come from the store (etcd),
    /// not from the document checked: rules that need them wait for the
    /// document composed with the store's.
    pub resources_elsewhere: bool,
}

impl Ctx {
    pub fn path(&self) -> String {
        let mut out = String::new();
        for seg in &self.path {
            if seg.starts_with('[') || out.is_empty() {
                out.push_str(seg);
            } else {
                out.push('.');
                out.push_str(seg);
            }
        }
        out
    }

    pub fn error(&mut self, line: Option<usize>, message: impl Into<String>) {
        let path = self.path();
        self.errors.push(FieldError { path, message: message.into(), line });
    }

    /// Records an error at `path` (relative to the current position).
    pub fn error_at(&mut self, field: &str, line: Option<usize>, message: impl Into<String>) {
        self.path.push(field.to_string());
        self.error(line, message);
        self.path.pop();
    }

    pub fn with_field<T>(&mut self, field: &str, f: impl FnOnce(&mut Ctx) -> T) -> T {
        self.path.push(field.to_string());
        let out = f(self);
        self.path.pop();
        out
    }

    pub fn with_index<T>(&mut self, index: usize, f: impl FnOnce(&mut Ctx) -> T) -> T {
        self.path.push(format!("[{index}]"));
        let out = f(self);
        self.path.pop();
        out
    }
}

/// A type that can be read from a config node. On a mistake it records the
/// error in `ctx` and returns `None`; the caller then uses a fallback.
pub trait Decode: Sized {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self>;
}

fn expected(node: &Node, ctx: &mut Ctx, what: &str) {
    let found = match &node.value {
        Value::Scalar { text, .. } => format!("{text:?}"),
        _ => node.kind().to_string(),
    };
    ctx.error(Some(node.line), format!("expected {what}, found {found}"));
}

impl Decode for String {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        match &node.value {
            Value::Scalar { text, .. } => Some(text.clone()),
            _ => {
                expected(node, ctx, "a string");
                None
            }
        }
    }
}

impl Decode for bool {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        match node.scalar() {
            Some("true") => Some(true),
            Some("false") => Some(false),
            _ => {
                expected(node, ctx, "true or false");
                None
            }
        }
    }
}

macro_rules! decode_int {
    ($($t:ty),*) => {$(
        impl Decode for $t {
            fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
                match node.scalar().map(|s| s.replace('_', "").parse::<$t>()) {
                    Some(Ok(v)) => Some(v),
                    _ => {
                        expected(node, ctx, concat!("an integer (", stringify!($t), ")"));
                        None
                    }
                }
            }
        }
    )*};
}
decode_int!(u8, u16, u32, u64, usize);

impl Decode for f64 {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        match node.scalar().map(str::parse::<f64>) {
            Some(Ok(v)) if v.is_finite() => Some(v),
            _ => {
                expected(node, ctx, "a number");
                None
            }
        }
    }
}

impl Decode for SocketAddr {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        match node.scalar().map(str::parse::<SocketAddr>) {
            Some(Ok(v)) => Some(v),
            _ => {
                expected(node, ctx, "an address with a port, such as 127.0.0.1:8080 or [::1]:8080");
                None
            }
        }
    }
}

impl Decode for IpAddr {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        match node.scalar().map(str::parse::<IpAddr>) {
            Some(Ok(v)) => Some(v),
            _ => {
                expected(node, ctx, "an IPv4 or IPv6 address");
                None
            }
        }
    }
}

impl Decode for std::net::Ipv4Addr {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        match node.scalar().map(str::parse::<std::net::Ipv4Addr>) {
            Some(Ok(v)) => Some(v),
            _ => {
                expected(node, ctx, "an IPv4 address");
                None
            }
        }
    }
}

impl Decode for ipnet::IpNet {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        let text = node.scalar();
        // A bare address is a host route: /32 or /128.
        let parsed = text
            .and_then(|s| s.parse::<ipnet::IpNet>().ok().or_else(|| s.parse::<IpAddr>().ok().map(ipnet::IpNet::from)));
        match parsed {
            Some(net) => Some(net.trunc()),
            None => {
                expected(node, ctx, "a CIDR block such as 10.0.0.0/8 or 2001:db8::/32, or an address");
                None
            }
        }
    }
}

/// Durations are written with a unit: `250ms`, `5s`, `2m`, `1h`.
impl Decode for Duration {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        match node.scalar().and_then(parse_duration) {
            Some(d) => Some(d),
            None => {
                expected(node, ctx, "a duration with a unit, such as 250ms, 5s, 2m or 1h");
                None
            }
        }
    }
}

pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs),
        "h" => n.checked_mul(3600).map(Duration::from_secs),
        _ => None,
    }
}

impl<T: Decode> Decode for Vec<T> {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        match &node.value {
            Value::Seq(items) => {
                let mut out = Vec::with_capacity(items.len());
                let mut ok = true;
                for (i, item) in items.iter().enumerate() {
                    match ctx.with_index(i, |ctx| T::decode(item, ctx)) {
                        Some(v) => out.push(v),
                        None => ok = false,
                    }
                }
                ok.then_some(out)
            }
            Value::Null => Some(Vec::new()),
            _ => {
                expected(node, ctx, "a list");
                None
            }
        }
    }
}

/// `Option<T>`: a null value is `None`, anything else must decode as `T`.
impl<T: Decode> Decode for Option<T> {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        match node.value {
            Value::Null => Some(None),
            _ => T::decode(node, ctx).map(Some),
        }
    }
}

/// A mapping of string keys to values, in document order.
impl<T: Decode> Decode for Vec<(String, T)> {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<Self> {
        match &node.value {
            Value::Map(entries) => {
                let mut out = Vec::new();
                let mut ok = true;
                for (k, v) in entries {
                    let Some(key) = k.scalar() else {
                        expected(k, ctx, "a string key");
                        ok = false;
                        continue;
                    };
                    match ctx.with_field(key, |ctx| T::decode(v, ctx)) {
                        Some(v) => out.push((key.to_string(), v)),
                        None => ok = false,
                    }
                }
                ok.then_some(out)
            }
            Value::Null => Some(Vec::new()),
            _ => {
                expected(node, ctx, "a mapping");
                None
            }
        }
    }
}

/// The known key `name` is most likely a typo of: at most one edit away
/// for short keys, two for keys of six characters or more.
fn closest<'k>(name: &str, known: &'k [String]) -> Option<&'k str> {
    let most = if name.chars().count() >= 6 { 2 } else { 1 };
    known
        .iter()
        // A swap of two neighbours counts as one edit (optimal string alignment).
        .map(|k| (strsim::osa_distance(name, k), k))
        .filter(|(d, _)| *d <= most)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k.as_str())
}

/// Reads the fields of one mapping. Unknown keys are reported by [`MapReader::finish`].
pub struct MapReader<'a> {
    pub line: usize,
    entries: &'a [(Node, Node)],
    seen: Vec<bool>,
    /// The keys readers asked for: what an unknown key may be a typo of.
    asked: Vec<String>,
}

impl<'a> MapReader<'a> {
    /// Starts reading `node` as a mapping; reports and returns `None` otherwise.
    pub fn new(node: &'a Node, ctx: &mut Ctx) -> Option<Self> {
        static EMPTY: [(Node, Node); 0] = [];
        match &node.value {
            Value::Map(entries) => {
                Some(MapReader { line: node.line, entries, seen: vec![false; entries.len()], asked: Vec::new() })
            }
            Value::Null => Some(MapReader { line: node.line, entries: &EMPTY, seen: Vec::new(), asked: Vec::new() }),
            _ => {
                expected(node, ctx, "a mapping");
                None
            }
        }
    }

    fn find(&mut self, key: &str) -> Option<&'a Node> {
        if !self.asked.iter().any(|k| k == key) {
            self.asked.push(key.to_string());
        }
        let pos = self.entries.iter().position(|(k, _)| k.scalar() == Some(key))?;
        self.seen[pos] = true;
        Some(&self.entries[pos].1)
    }

    pub fn has(&self, key: &str) -> bool {
        self.entries.iter().any(|(k, v)| k.scalar() == Some(key) && v.value != Value::Null)
    }

    /// The line of `key` if present, else the line of the mapping.
    pub fn line_of(&self, key: &str) -> usize {
        self.entries.iter().find(|(k, _)| k.scalar() == Some(key)).map_or(self.line, |(k, _)| k.line)
    }

    /// A field that may be absent (or null): then `default`. A present but
    /// wrong value is reported and `default` is returned.
    pub fn or<T: Decode>(&mut self, ctx: &mut Ctx, key: &str, default: T) -> T {
        match self.find(key) {
            Some(node) if node.value != Value::Null => {
                ctx.with_field(key, |ctx| T::decode(node, ctx)).unwrap_or(default)
            }
            _ => default,
        }
    }

    /// A field that may be absent (or null).
    pub fn opt<T: Decode>(&mut self, ctx: &mut Ctx, key: &str) -> Option<T> {
        match self.find(key) {
            Some(node) if node.value != Value::Null => ctx.with_field(key, |ctx| T::decode(node, ctx)),
            _ => None,
        }
    }

    /// A field that must be present. A missing one is reported; the fallback
    /// is `T::default()` so decoding can go on to find further errors.
    pub fn req<T: Decode + Default>(&mut self, ctx: &mut Ctx, key: &str) -> T {
        match self.find(key) {
            Some(node) if node.value != Value::Null => {
                ctx.with_field(key, |ctx| T::decode(node, ctx)).unwrap_or_default()
            }
            _ => {
                ctx.error_at(key, Some(self.line), "is required");
                T::default()
            }
        }
    }

    /// Reports every key that no reader asked for.
    pub fn finish(self, ctx: &mut Ctx) {
        for ((k, _), seen) in self.entries.iter().zip(&self.seen) {
            if !seen {
                let name = k.scalar().unwrap_or("?");
                let message = match closest(name, &self.asked) {
                    Some(known) => format!("unknown field; did you mean {known}?"),
                    None => "unknown field".to_string(),
                };
                ctx.error_at(name, Some(k.line), &message);
            }
        }
    }
}

/// An enum the config file spells by name: one table both decodes it and
/// names it back (in `/status`), so the two cannot drift apart.
pub trait Named: Copy + PartialEq + 'static {
    /// Every value with the name the config file uses for it.
    const NAMES: &'static [(&'static str, Self)];

    /// The name the config file uses.
    fn name(self) -> &'static str {
        Self::NAMES.iter().find(|(_, v)| *v == self).map_or("", |(n, _)| n)
    }
}

/// A [`Named`] enum decodes from its name.
impl<T: Named> Decode for T {
    fn decode(node: &Node, ctx: &mut Ctx) -> Option<T> {
        decode_enum(node, ctx, T::NAMES)
    }
}

/// Decodes a scalar that must be one of `names`, mapping each to a value.
pub fn decode_enum<T: Copy>(node: &Node, ctx: &mut Ctx, choices: &[(&str, T)]) -> Option<T> {
    let text = node.scalar();
    if let Some(&(_, v)) = choices.iter().find(|(name, _)| Some(*name) == text) {
        return Some(v);
    }
    let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
    expected(node, ctx, &format!("one of {}", names.join(", ")));
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml::parse;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("5s"), Some(Duration::from_secs(5)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_duration("5"), None);
        assert_eq!(parse_duration("s"), None);
        assert_eq!(parse_duration("5 parsecs"), None);
    }

    /// Every name of a table decodes to its value and is written back
    /// the same, and the default value has a name.
    fn round_trips<T: Named + Decode + Default + std::fmt::Debug>() {
        for &(name, value) in T::NAMES {
            let mut ctx = Ctx::default();
            let node = parse(name).expect("yaml");
            assert_eq!(T::decode(&node, &mut ctx), Some(value), "{name}");
            assert_eq!(value.name(), name);
        }
        assert_ne!(T::default().name(), "", "{:?} has no name", T::default());
    }

    #[test]
    fn named_enums_decode_and_name_back_alike() {
        use crate::model::{Balance, HealthCheckKind, L4Mode, L4Protocol, L4Scheduler};
        round_trips::<Balance>();
        round_trips::<HealthCheckKind>();
        round_trips::<L4Protocol>();
        round_trips::<L4Scheduler>();
        round_trips::<L4Mode>();
        let mut ctx = Ctx::default();
        assert_eq!(L4Mode::decode(&parse("tunnel").expect("yaml"), &mut ctx), None);
        assert!(ctx.errors[0].message.contains("nat, fnat, dr, ipip, gue"), "{:?}", ctx.errors);
    }

    #[test]
    fn errors_carry_the_path_and_keep_going() {
        let root = parse("items:\n  - 1\n  - x\n  - 3\n  - y\n").expect("yaml");
        let mut ctx = Ctx::default();
        let mut m = MapReader::new(&root, &mut ctx).expect("map");
        let items: Vec<u32> = m.or(&mut ctx, "items", Vec::new());
        m.finish(&mut ctx);
        assert!(items.is_empty());
        let paths: Vec<_> = ctx.errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["items[1]", "items[3]"]);
        assert_eq!(ctx.errors[0].line, Some(3));
    }

    #[test]
    fn unknown_and_missing_fields_are_reported() {
        let root = parse("nmae: x\n").expect("yaml");
        let mut ctx = Ctx::default();
        let mut m = MapReader::new(&root, &mut ctx).expect("map");
        let _name: String = m.req(&mut ctx, "name");
        m.finish(&mut ctx);
        let text: Vec<String> = ctx.errors.iter().map(ToString::to_string).collect();
        assert_eq!(text, ["name: is required (line 1)", "nmae: unknown field; did you mean name? (line 1)"]);
        let root = parse("adress: x\nhealth_chek: y\ncolour: z\n").expect("yaml");
        let mut ctx = Ctx::default();
        let mut m = MapReader::new(&root, &mut ctx).expect("map");
        let _a: Option<String> = m.opt(&mut ctx, "address");
        let _h: Option<String> = m.opt(&mut ctx, "health_check");
        let _n: Option<String> = m.opt(&mut ctx, "name");
        m.finish(&mut ctx);
        let text: Vec<String> = ctx.errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "adress: unknown field; did you mean address? (line 1)",
                "health_chek: unknown field; did you mean health_check? (line 2)",
                "colour: unknown field (line 3)",
            ]
        );
        // The metric the guesses use counts a swap of neighbours as one edit.
        let edits = strsim::osa_distance;
        assert_eq!(
            (edits("", "abc"), edits("kitten", "sitting"), edits("same", "same"), edits("nmae", "name")),
            (3, 3, 0, 1)
        );
    }

    #[test]
    fn cidr_accepts_bare_addresses() {
        let root = parse("- 10.1.2.3\n- 2001:db8::/32\n- 10.0.0.1/8\n").expect("yaml");
        let mut ctx = Ctx::default();
        let nets = Vec::<ipnet::IpNet>::decode(&root, &mut ctx).expect("nets");
        assert_eq!(nets[0].to_string(), "10.1.2.3/32");
        assert_eq!(nets[1].to_string(), "2001:db8::/32");
        assert_eq!(nets[2].to_string(), "10.0.0.0/8");
    }
}
