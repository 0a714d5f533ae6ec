//! The config as a document: the tree a file was parsed into, edited by the
//! admin API and written back as YAML.
//!
//! The admin API works on the document, not on the typed [`Config`](crate::Config):
//! a resource reads back exactly as it was written (defaults are not filled
//! in), a write replaces one entry of one list, and the whole edited document
//! goes through the same decoding and validation as a file does.

use serde_json::Value as Json;

use crate::yaml::{Node, Value};

/// The top-level lists the admin API manages, each entry named by its
/// `name` field.
pub const KINDS: [&str; 3] = ["routes", "upstreams", "certificates"];

/// The peers of a WireGuard interface (`wireguard.interfaces[name].peers`):
/// a resource named `INTERFACE/PEER`.
pub const PEERS: &str = "peers";

/// A resource's list (`scope`: the interface, for peers) and its name in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Location<'a> {
    pub scope: Option<&'a str>,
    pub name: &'a str,
}

/// Where the resource `kind`/`full` is: peers are named `INTERFACE/PEER`.
pub fn locate<'a>(kind: &str, full: &'a str) -> Location<'a> {
    match full.split_once('/') {
        Some((scope, name)) if kind == PEERS => Location { scope: Some(scope), name },
        _ => Location { scope: None, name: full },
    }
}

/// The value of `key` in a mapping.
fn get<'a>(node: &'a Node, key: &str) -> Option<&'a Node> {
    let Value::Map(entries) = &node.value else { return None };
    entries.iter().find(|(k, _)| k.scalar() == Some(key)).map(|(_, v)| v)
}

/// An entry's name in its list: its `name`, or for a peer without one the
/// first eight characters of its public key (the config's default).
pub fn entry_name<'a>(kind: &str, entry: &'a Node) -> Option<&'a str> {
    name_of(entry).or_else(|| {
        let key = get(entry, "public_key")?.scalar()?;
        (kind == PEERS).then(|| key.get(..8)).flatten()
    })
}

/// The names of the WireGuard interfaces in the document.
pub fn interface_names(root: &Node) -> Vec<String> {
    let interfaces = get(root, "wireguard").and_then(|w| get(w, "interfaces"));
    let Some(Node { value: Value::Seq(items), .. }) = interfaces else { return Vec::new() };
    items.iter().filter_map(name_of).map(str::to_string).collect()
}

/// Whether `kind` is a kind of resource the admin API manages.
pub fn is_kind(kind: &str) -> bool {
    KINDS.contains(&kind) || kind == PEERS
}

/// The entries of a resource list (empty when absent): a top-level list,
/// or the peers of the interface `scope`.
pub fn entries<'a>(root: &'a Node, kind: &str, scope: Option<&str>) -> &'a [Node] {
    if kind != PEERS {
        return list(root, kind);
    }
    let interfaces = get(root, "wireguard").and_then(|w| get(w, "interfaces"));
    let Some(Node { value: Value::Seq(items), .. }) = interfaces else { return &[] };
    match items.iter().find(|i| name_of(i) == scope).and_then(|i| get(i, "peers")) {
        Some(Node { value: Value::Seq(peers), .. }) => peers,
        _ => &[],
    }
}

/// Why a resource list cannot be edited in a document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListError {
    #[error("the config is not a mapping")]
    NotAMapping,
    #[error("{0}: expected a list")]
    NotAList(String),
    #[error("there is no WireGuard interface {0:?} in the config")]
    NoInterface(String),
}

/// The entries of a resource list to edit, with the list's path in the
/// config (`routes`, `wireguard.interfaces[0].peers`). A top-level list is
/// made if absent; peers need their interface to be in the config.
pub fn entries_mut<'a>(
    root: &'a mut Node,
    kind: &str,
    scope: Option<&str>,
) -> Result<(&'a mut Vec<Node>, String), ListError> {
    if kind != PEERS {
        return list_mut(root, kind).map(|l| (l, kind.to_string()));
    }
    let scope = scope.unwrap_or_default();
    let missing = || ListError::NoInterface(scope.to_string());
    let Value::Map(top) = &mut root.value else { return Err(missing()) };
    let Some((_, wg)) = top.iter_mut().find(|(k, _)| k.scalar() == Some("wireguard")) else { return Err(missing()) };
    let interfaces = list_mut(wg, "interfaces").map_err(|_| missing())?;
    let at = interfaces.iter().position(|i| name_of(i) == Some(scope)).ok_or_else(missing)?;
    let peers = list_mut(&mut interfaces[at], "peers")?;
    Ok((peers, format!("wireguard.interfaces[{at}].peers")))
}

fn scalar(text: impl Into<String>, plain: bool) -> Node {
    Node { line: 0, value: Value::Scalar { text: text.into(), plain } }
}

/// A JSON value as a document node. Strings stay strings (a JSON "true" is
/// not a boolean); numbers, booleans and null are what YAML would read.
pub fn from_json(v: &Json) -> Node {
    let value = match v {
        Json::Null => Value::Null,
        Json::Bool(b) => return scalar(b.to_string(), true),
        Json::Number(n) => return scalar(n.to_string(), true),
        Json::String(s) => return scalar(s.as_str(), false),
        Json::Array(items) => Value::Seq(items.iter().map(from_json).collect()),
        Json::Object(map) => Value::Map(map.iter().map(|(k, v)| (scalar(k.as_str(), true), from_json(v))).collect()),
    };
    Node { line: 0, value }
}

/// A document node as JSON: plain scalars that read as booleans or numbers
/// become those, everything else a string.
pub fn to_json(n: &Node) -> Json {
    match &n.value {
        Value::Null => Json::Null,
        Value::Scalar { text, plain: false } => Json::String(text.clone()),
        Value::Scalar { text, plain: true } => match text.as_str() {
            "true" => Json::Bool(true),
            "false" => Json::Bool(false),
            t => {
                if let Ok(i) = t.parse::<i64>() {
                    Json::from(i)
                } else if let Some(f) = t.parse::<f64>().ok().filter(|f| f.is_finite() && t.contains('.')) {
                    Json::from(f)
                } else {
                    Json::String(t.to_string())
                }
            }
        },
        Value::Seq(items) => Json::Array(items.iter().map(to_json).collect()),
        Value::Map(entries) => Json::Object(
            entries
                .iter()
                .map(|(k, v)| (k.scalar().map_or_else(|| to_json(k).to_string(), str::to_string), to_json(v)))
                .collect(),
        ),
    }
}

/// The `name` of a list entry.
pub fn name_of(entry: &Node) -> Option<&str> {
    match &entry.value {
        Value::Map(entries) => entries.iter().find(|(k, _)| k.scalar() == Some("name")).and_then(|(_, v)| v.scalar()),
        _ => None,
    }
}

/// The entries of a top-level list (empty when absent or not a list).
pub fn list<'a>(root: &'a Node, kind: &str) -> &'a [Node] {
    let Value::Map(entries) = &root.value else { return &[] };
    match entries.iter().find(|(k, _)| k.scalar() == Some(kind)) {
        Some((_, Node { value: Value::Seq(items), .. })) => items,
        _ => &[],
    }
}

/// The entries of a top-level list, to edit; the key is added if absent.
pub fn list_mut<'a>(root: &'a mut Node, kind: &str) -> Result<&'a mut Vec<Node>, ListError> {
    if root.value == Value::Null {
        root.value = Value::Map(Vec::new());
    }
    let Value::Map(entries) = &mut root.value else { return Err(ListError::NotAMapping) };
    let at = match entries.iter().position(|(k, _)| k.scalar() == Some(kind)) {
        Some(i) => i,
        None => {
            entries.push((scalar(kind, true), Node { line: 0, value: Value::Seq(Vec::new()) }));
            entries.len() - 1
        }
    };
    let value = &mut entries[at].1;
    if value.value == Value::Null {
        value.value = Value::Seq(Vec::new());
    }
    match &mut value.value {
        Value::Seq(items) => Ok(items),
        _ => Err(ListError::NotAList(kind.to_string())),
    }
}

/// Whether a plain scalar can be written back without quotes and read the
/// same: a conservative subset (no spaces, no YAML indicators up front,
/// not a document marker: `...` alone on a line ends the document, found
/// by the config fuzz target).
fn safe_plain(t: &str) -> bool {
    if t.starts_with("...") || t.starts_with("---") {
        return false;
    }
    let Some(first) = t.chars().next() else { return false };
    let first_ok = first.is_ascii_alphanumeric()
        || first == '/'
        || first == '.'
        || first == '_'
        || (first == '-' && t.chars().nth(1).is_some_and(|c| c.is_ascii_digit()));
    first_ok && !t.ends_with(':') && t.chars().all(|c| c.is_ascii_alphanumeric() || "._/-:@+=%~".contains(c))
}

fn emit_scalar(out: &mut String, text: &str, plain: bool) {
    // A plain scalar that reads as a number or a boolean stays plain even
    // where `safe_plain` is stricter (`+6`, `-.5`): quoted it would read
    // back as a string. Found by the config fuzz target.
    let typed = || !to_json(&scalar(text, true)).is_string();
    if plain && (safe_plain(text) || typed()) {
        out.push_str(text);
    } else {
        // JSON's string escapes are valid in YAML's double-quoted style.
        out.push_str(&Json::String(text.to_string()).to_string());
    }
}

/// Scalars, null and empty collections fit on their key's line.
fn inline(n: &Node) -> bool {
    match &n.value {
        Value::Scalar { .. } | Value::Null => true,
        Value::Seq(items) => items.is_empty(),
        Value::Map(entries) => entries.is_empty(),
    }
}

fn emit_inline(out: &mut String, n: &Node) {
    match &n.value {
        Value::Scalar { text, plain } => emit_scalar(out, text, *plain),
        Value::Null => out.push_str("null"),
        Value::Seq(_) => out.push_str("[]"),
        Value::Map(_) => out.push_str("{}"),
    }
}

fn pad(out: &mut String, indent: usize) {
    out.extend(std::iter::repeat_n(' ', indent));
}

/// YAML's limit on an implicit key: at most 1024 characters, all on the
/// key's line (YAML 1.2, section 7.4.2).
const IMPLICIT_KEY_MAX: usize = 1024;

/// The entries of a mapping, one per line; the first one's indentation is
/// already written when `first_inline` (it follows a "- ").
fn emit_map(out: &mut String, entries: &[(Node, Node)], indent: usize, first_inline: bool) {
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 || !first_inline {
            pad(out, indent);
        }
        let mut key = String::new();
        emit_inline(&mut key, k);
        if key.chars().count() > IMPLICIT_KEY_MAX {
            // Too long for an implicit key, so an explicit one (`? key`
            // then `: value`): a key read in plain may need escapes in
            // quotes. Found by the config fuzz target.
            out.push_str("? ");
            out.push_str(&key);
            out.push('\n');
            pad(out, indent);
        } else {
            out.push_str(&key);
        }
        out.push(':');
        if inline(v) {
            out.push(' ');
            emit_inline(out, v);
            out.push('\n');
        } else {
            out.push('\n');
            emit_block(out, v, indent + 2);
        }
    }
}

fn emit_block(out: &mut String, n: &Node, indent: usize) {
    match &n.value {
        Value::Map(entries) if !entries.is_empty() => emit_map(out, entries, indent, false),
        Value::Seq(items) if !items.is_empty() => {
            for item in items {
                pad(out, indent);
                out.push_str("- ");
                match &item.value {
                    Value::Map(entries) if !entries.is_empty() => emit_map(out, entries, indent + 2, true),
                    Value::Seq(inner) if !inner.is_empty() => {
                        out.push('\n');
                        emit_block(out, item, indent + 2);
                    }
                    _ => {
                        emit_inline(out, item);
                        out.push('\n');
                    }
                }
            }
        }
        _ => {
            pad(out, indent);
            emit_inline(out, n);
            out.push('\n');
        }
    }
}

/// The document as YAML text (block style; comments are not kept).
pub fn emit(root: &Node) -> String {
    let mut out = String::from("# Written by Gatehouse (admin API). Comments are not kept.\n");
    emit_block(&mut out, root, 0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml::parse;

    /// The same tree without line numbers.
    fn shape(n: &Node) -> Node {
        let value = match &n.value {
            Value::Seq(items) => Value::Seq(items.iter().map(shape).collect()),
            Value::Map(entries) => Value::Map(entries.iter().map(|(k, v)| (shape(k), shape(v))).collect()),
            v => v.clone(),
        };
        Node { line: 0, value }
    }

    const DOC: &str = r#"
workers: 2
admin: { address: 127.0.0.1:9180, allow: [10.0.0.0/8, "::1/128"] }
listeners:
  - { name: web, address: "[::1]:8080" }
  - name: tls
    address: 0.0.0.0:8443
    protocol: https
    tls: { min_version: "1.3", ciphers: "ECDHE-RSA-AES256-GCM-SHA384:AES256-GCM-SHA384", alpn: [] }
certificates:
  - { name: c, self_signed: true, sni: [localhost, "*.example.com"] }
upstreams:
  - name: u
    endpoints: [127.0.0.1:9001, { address: 127.0.0.1:9002, weight: 3 }]
    health_check: { interval: 500ms, timeout: -1 }
routes:
  - name: hello
    match: { path_prefix: /, headers: [{ name: x-a, value: "yes: really # not a comment" }] }
    direct_response: { status: 200, headers: { content-type: text/plain }, body: "line one\nline \"two\"\t\u00e9" }
  - name: empty
    direct_response: { status: 204, body: "" }
    deny: ~
    allow: {}
nested: [[1, 2], [], [[x]]]
"#;

    #[test]
    fn numbers_written_with_a_sign_stay_numbers() {
        for text in ["weight: +6\n", "x: -.5\n", "x: +00\n", "x: 1e5\n"] {
            let doc = parse(text).expect("parses");
            let again = parse(&emit(&doc)).expect("reads back");
            assert_eq!(to_json(&again), to_json(&doc), "{text}");
        }
    }

    #[test]
    fn emitted_yaml_reads_back_as_the_same_document() {
        let doc = parse(DOC).expect("parses");
        let text = emit(&doc);
        let again = parse(&text).unwrap_or_else(|e| panic!("{e:?}\n{text}"));
        assert_eq!(shape(&again), shape(&doc), "{text}");
        // A valid document gives the same typed config before and after.
        let valid = DOC
            .replace(", timeout: -1", "")
            .replace("    deny: ~\n    allow: {}\n", "")
            .replace("nested: [[1, 2], [], [[x]]]\n", "");
        let before = crate::from_str(&valid, std::path::Path::new("g")).expect("valid");
        let text = emit(&parse(&valid).expect("parses"));
        assert_eq!(crate::from_str(&text, std::path::Path::new("g")).expect("still valid"), before, "{text}");
    }

    #[test]
    fn a_key_longer_quoted_than_an_implicit_key_may_be_reads_back() {
        let long = "\u{15}".repeat(200) + " {&g-k";
        for j in [
            serde_json::json!({ long.clone(): null, "b": 1 }),
            serde_json::json!({ "routes": [{ long.clone(): { "x": [1] }, "name": "r" }] }),
        ] {
            let text = emit(&from_json(&j));
            assert!(text.contains("? \""), "{text}");
            assert_eq!(to_json(&parse(&text).unwrap_or_else(|e| panic!("{e:?}\n{text}"))), j, "{text}");
        }
        // A key within the limit stays implicit.
        assert!(!emit(&from_json(&serde_json::json!({ "a".repeat(1000): 1 }))).contains('?'));
    }

    #[test]
    fn json_round_trip_keeps_strings_strings() {
        let j: Json = serde_json::from_str(r#"{"name":"r","direct_response":{"status":200,"body":"true"},"allow":["10.0.0.0/8"],"x":null,"f":1.5,"b":false}"#)
            .expect("json");
        let n = from_json(&j);
        assert_eq!(to_json(&n), j);
        assert_eq!(name_of(&n), Some("r"));
        let text = emit(&n);
        assert_eq!(to_json(&parse(&text).expect("parses")), j, "{text}");
    }

    #[test]
    fn lists_are_found_and_made() {
        let mut doc = parse("routes:\n  - { name: a }\n").expect("parses");
        assert_eq!(list(&doc, "routes").len(), 1);
        assert!(list(&doc, "upstreams").is_empty());
        list_mut(&mut doc, "upstreams").expect("made").push(from_json(&serde_json::json!({"name": "u"})));
        assert_eq!(name_of(&list(&doc, "upstreams")[0]), Some("u"));
        let mut bad = parse("routes: 3\n").expect("parses");
        assert!(list_mut(&mut bad, "routes").is_err());
        let mut empty = parse("").expect("parses");
        assert!(list_mut(&mut empty, "routes").is_ok());
    }
}
