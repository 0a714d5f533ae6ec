//! The admin API's resources: `routes`, `upstreams` and `certificates`, each
//! entry named by its `name`, and `/config`, the whole document.
//!
//! Shapes follow APISIX's Admin API (`{"key", "value", "modifiedIndex"}`,
//! lists as `{"total", "list"}`, errors as `{"error_msg"}`). Every write edits
//! a copy of the running document, which then goes through the same decoding,
//! validation and compilation as a config file: any error answers 400 with
//! the field paths and changes nothing. Versions: a resource's
//! `modifiedIndex` is the config version that last changed it, also sent as
//! its `ETag`; a write with `If-Match` naming another version gets 409.

use gatehouse_config::doc;
use gatehouse_l7::server::{ApplyError, Control, Shared};
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::{Map, Value, json};

use crate::{Body, error, json_response};

/// Largest request body the API reads.
const MAX_BODY: usize = 1 << 20;

fn with_etag(mut r: Response<Body>, version: u64) -> Response<Body> {
    if let Ok(v) = HeaderValue::from_str(&format!("\"{version}\"")) {
        r.headers_mut().insert(header::ETAG, v);
    }
    r
}

fn entry_json(kind: &str, name: &str, value: Value, version: u64) -> Value {
    json!({ "key": format!("/{kind}/{name}"), "value": value, "modifiedIndex": version })
}

/// What `If-Match` asks for.
enum Precondition {
    None,
    Any,
    Version(u64),
}

fn precondition(req: &Request<Incoming>) -> Result<Precondition, Response<Body>> {
    let Some(v) = req.headers().get(header::IF_MATCH) else { return Ok(Precondition::None) };
    let text = v.to_str().unwrap_or("").trim();
    if text == "*" {
        return Ok(Precondition::Any);
    }
    text.trim_start_matches("W/").trim_matches('"').parse::<u64>().map(Precondition::Version).map_err(|_| {
        error(StatusCode::BAD_REQUEST, format!("If-Match: expected a version such as \"7\" or *, found {text:?}"))
    })
}

/// 409 unless the precondition holds for a resource at `current`.
fn check_version(pre: &Precondition, current: Option<u64>, what: &str) -> Result<(), Response<Body>> {
    match (pre, current) {
        (Precondition::None, _) | (Precondition::Any, Some(_)) => Ok(()),
        (Precondition::Version(want), Some(have)) if *want == have => Ok(()),
        (Precondition::Any, None) => Err(error(StatusCode::CONFLICT, format!("{what} does not exist (If-Match: *)"))),
        (Precondition::Version(want), Some(have)) => Err(error(
            StatusCode::CONFLICT,
            format!("{what} is at version {have}, not {want} (If-Match): read it again and retry"),
        )),
        (Precondition::Version(want), None) => {
            Err(error(StatusCode::CONFLICT, format!("{what} does not exist, not at version {want} (If-Match)")))
        }
    }
}

async fn read_json(req: Request<Incoming>) -> Result<Value, Response<Body>> {
    let body = Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| error(StatusCode::BAD_REQUEST, format!("cannot read the request body: {e}")))?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|e| error(StatusCode::BAD_REQUEST, format!("invalid JSON: {e}")))
}

/// 400 with every error's path; `kind[index]` also as a path inside the
/// resource written, when the error lies there.
fn invalid(e: &ApplyError, within: Option<(&str, usize)>) -> Response<Body> {
    match e {
        ApplyError::Invalid(errors) => {
            let prefix = within.map(|(kind, i)| format!("{kind}[{i}]"));
            let list: Vec<Value> = errors
                .errors
                .iter()
                .map(|fe| {
                    let mut o = json!({ "path": fe.path, "message": fe.message });
                    if let Some(rest) = prefix.as_deref().and_then(|p| fe.path.strip_prefix(p)) {
                        o["field"] = Value::from(rest.trim_start_matches('.'));
                    }
                    o
                })
                .collect();
            let first = errors.errors.first().map_or_else(String::new, |fe| format!("{}: {}", fe.path, fe.message));
            json_response(
                StatusCode::BAD_REQUEST,
                &json!({ "error_msg": format!("invalid configuration: {first}"), "errors": list }),
            )
        }
        ApplyError::Store(msg) => error(StatusCode::INTERNAL_SERVER_ERROR, msg.clone()),
    }
}

/// RFC 7396 JSON merge patch.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.shift_remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// The stored form of a resource: `name` (from the path) first, then the
/// fields as sent. A `name` field that differs from the path is refused.
fn named_entry(what: &str, name: &str, value: Value) -> Result<Value, Response<Body>> {
    let Value::Object(fields) = value else {
        return Err(error(StatusCode::BAD_REQUEST, format!("{what} must stay a JSON object")));
    };
    if let Some(n) = fields.get("name")
        && n.as_str() != Some(name)
    {
        let msg = format!("must be {name:?}, the name in the path");
        return Err(json_response(
            StatusCode::BAD_REQUEST,
            &json!({ "error_msg": format!("name: {msg}"), "errors": [{ "path": "name", "field": "name", "message": msg }] }),
        ));
    }
    let mut entry = Map::new();
    entry.insert("name".into(), Value::from(name));
    entry.extend(fields.into_iter().filter(|(k, _)| k != "name"));
    Ok(Value::Object(entry))
}

/// `/config`: the whole document.
pub async fn config(req: Request<Incoming>, shared: &Shared) -> Response<Body> {
    match *req.method() {
        Method::GET | Method::HEAD => {
            let control = shared.control();
            let version = shared.snapshot.load().version;
            with_etag(
                json_response(StatusCode::OK, &json!({ "version": version, "value": doc::to_json(&control.doc) })),
                version,
            )
        }
        Method::PUT if shared.store.is_some() => {
            error(StatusCode::CONFLICT, "with store: etcd, change routes, upstreams and certificates one by one")
        }
        Method::PUT => {
            let pre = match precondition(&req) {
                Ok(p) => p,
                Err(r) => return r,
            };
            let body = match read_json(req).await {
                Ok(Value::Object(m)) => Value::Object(m),
                Ok(_) => return error(StatusCode::BAD_REQUEST, "expected a JSON object: the whole config"),
                Err(r) => return r,
            };
            let mut control = shared.control();
            if let Err(r) = check_version(&pre, Some(shared.snapshot.load().version), "the config") {
                return r;
            }
            match shared.apply(&mut control, doc::from_json(&body), true) {
                Ok(version) => {
                    with_etag(json_response(StatusCode::OK, &json!({ "version": version, "value": body })), version)
                }
                Err(e) => invalid(&e, None),
            }
        }
        _ => not_allowed("GET, HEAD, PUT"),
    }
}

fn not_allowed(allow: &'static str) -> Response<Body> {
    let mut r = error(StatusCode::METHOD_NOT_ALLOWED, format!("allowed methods: {allow}"));
    r.headers_mut().insert(header::ALLOW, HeaderValue::from_static(allow));
    r
}

fn position(control: &Control, kind: &str, name: &str) -> Option<usize> {
    doc::list(&control.doc, kind).iter().position(|e| doc::name_of(e) == Some(name))
}

/// `/{kind}` and `/{kind}/{name}`.
pub async fn resource(
    req: Request<Incoming>,
    shared: &Shared,
    kind: &'static str,
    name: Option<String>,
) -> Response<Body> {
    let Some(name) = name else {
        if !matches!(*req.method(), Method::GET | Method::HEAD) {
            return not_allowed("GET, HEAD");
        }
        let control = shared.control();
        let list: Vec<Value> = doc::list(&control.doc, kind)
            .iter()
            .filter_map(|e| {
                let n = doc::name_of(e)?;
                let v = control.versions.get(&(kind, n.to_string())).copied().unwrap_or(0);
                Some(entry_json(kind, n, doc::to_json(e), v))
            })
            .collect();
        let version = shared.snapshot.load().version;
        return with_etag(json_response(StatusCode::OK, &json!({ "total": list.len(), "list": list })), version);
    };
    let what = format!("{kind}/{name}");
    let pre = match precondition(&req) {
        Ok(p) => p,
        Err(r) => return r,
    };
    match *req.method() {
        Method::GET | Method::HEAD => {
            let control = shared.control();
            let Some(i) = position(&control, kind, &name) else {
                return error(StatusCode::NOT_FOUND, format!("no {what}"));
            };
            let v = control.versions.get(&(kind, name.clone())).copied().unwrap_or(0);
            let value = doc::to_json(&doc::list(&control.doc, kind)[i]);
            with_etag(json_response(StatusCode::OK, &entry_json(kind, &name, value, v)), v)
        }
        Method::PUT | Method::PATCH => {
            let patch = req.method() == Method::PATCH;
            let body = match read_json(req).await {
                Ok(Value::Object(m)) => m,
                Ok(_) => {
                    return error(StatusCode::BAD_REQUEST, format!("expected a JSON object: the fields of {what}"));
                }
                Err(r) => return r,
            };
            if let Some(etcd) = shared.store.clone() {
                return etcd_write(shared, &etcd, kind, &name, &pre, Some((body, patch))).await;
            }
            let mut control = shared.control();
            let current = control.versions.get(&(kind, name.clone())).copied();
            let at = position(&control, kind, &name);
            if let Err(r) = check_version(&pre, at.map(|_| current.unwrap_or(0)), &what) {
                return r;
            }
            let mut value = Value::Object(body);
            if patch {
                let Some(i) = at else { return error(StatusCode::NOT_FOUND, format!("no {what} to patch")) };
                let mut base = doc::to_json(&doc::list(&control.doc, kind)[i]);
                merge_patch(&mut base, &value);
                value = base;
            }
            let entry = match named_entry(&what, &name, value) {
                Ok(e) => e,
                Err(r) => return r,
            };
            let mut new_doc = control.doc.clone();
            let index = match doc::list_mut(&mut new_doc, kind) {
                Ok(list) => match at {
                    Some(i) => {
                        list[i] = doc::from_json(&entry);
                        i
                    }
                    None => {
                        list.push(doc::from_json(&entry));
                        list.len() - 1
                    }
                },
                Err(e) => return error(StatusCode::CONFLICT, format!("the running config cannot take {what}: {e}")),
            };
            match shared.apply(&mut control, new_doc, true) {
                Ok(_) => {
                    let v = control.versions.get(&(kind, name.clone())).copied().unwrap_or(0);
                    let status = if at.is_some() { StatusCode::OK } else { StatusCode::CREATED };
                    with_etag(json_response(status, &entry_json(kind, &name, entry, v)), v)
                }
                Err(e) => invalid(&e, Some((kind, index))),
            }
        }
        Method::DELETE => {
            if let Some(etcd) = shared.store.clone() {
                return etcd_write(shared, &etcd, kind, &name, &pre, None).await;
            }
            let mut control = shared.control();
            let Some(i) = position(&control, kind, &name) else {
                return error(StatusCode::NOT_FOUND, format!("no {what}"));
            };
            let current = control.versions.get(&(kind, name.clone())).copied().unwrap_or(0);
            if let Err(r) = check_version(&pre, Some(current), &what) {
                return r;
            }
            let mut new_doc = control.doc.clone();
            if let Ok(list) = doc::list_mut(&mut new_doc, kind) {
                list.remove(i);
            }
            match shared.apply(&mut control, new_doc, true) {
                Ok(version) => {
                    json_response(StatusCode::OK, &json!({ "deleted": format!("/{what}"), "config_version": version }))
                }
                Err(e) => invalid(&e, None),
            }
        }
        _ => not_allowed("GET, HEAD, PUT, PATCH, DELETE"),
    }
}

/// A write with `store: etcd`: checked against the whole resulting config
/// here, then a transaction in etcd that holds only if the key's mod revision
/// is still the one this node knows (409 otherwise: another node changed it),
/// then applied here at once; other nodes get it through their watch.
/// `change`: the fields sent and whether they patch, or `None` to delete.
async fn etcd_write(
    shared: &Shared,
    etcd: &gatehouse_l7::store::Etcd,
    kind: &'static str,
    name: &str,
    pre: &Precondition,
    change: Option<(Map<String, Value>, bool)>,
) -> Response<Body> {
    use gatehouse_l7::store::WriteError;
    let what = format!("{kind}/{name}");
    let _one_at_a_time = etcd.write_lock.lock().await;
    let key = format!("{kind}/{name}");
    let current = etcd.mirror.lock().unwrap_or_else(|e| e.into_inner()).entries.get(&key).cloned();
    let expected = current.as_ref().map_or(0, |(_, rev)| *rev);
    if let Err(r) = check_version(pre, current.as_ref().map(|(_, rev)| u64::try_from(*rev).unwrap_or(0)), &what) {
        return r;
    }
    let entry = match change {
        None => {
            if current.is_none() {
                return error(StatusCode::NOT_FOUND, format!("no {what}"));
            }
            None
        }
        Some((fields, patch)) => {
            let mut value = Value::Object(fields);
            if patch {
                let Some((base, _)) = &current else {
                    return error(StatusCode::NOT_FOUND, format!("no {what} to patch"));
                };
                let mut merged = base.clone();
                merge_patch(&mut merged, &value);
                value = merged;
            }
            match named_entry(&what, name, value) {
                Ok(e) => Some(e),
                Err(r) => return r,
            }
        }
    };
    // The whole resulting config must be valid before anything is written.
    let (new_doc, index) = {
        let control = shared.control();
        let mut new_doc = control.doc.clone();
        let index = match doc::list_mut(&mut new_doc, kind) {
            Ok(list) => {
                let at = list.iter().position(|e| doc::name_of(e) == Some(name));
                match (&entry, at) {
                    (Some(e), Some(i)) => {
                        list[i] = doc::from_json(e);
                        Some(i)
                    }
                    (Some(e), None) => {
                        list.push(doc::from_json(e));
                        Some(list.len() - 1)
                    }
                    (None, Some(i)) => {
                        list.remove(i);
                        None
                    }
                    (None, None) => None,
                }
            }
            Err(e) => return error(StatusCode::CONFLICT, format!("the running config cannot take {what}: {e}")),
        };
        (new_doc, index)
    };
    if let Err(e) = shared.check_doc(&new_doc) {
        return invalid(&e, index.map(|i| (kind, i)));
    }
    match etcd.write(kind, name, entry.as_ref(), expected).await {
        Ok(revision) => {
            gatehouse_l7::store::apply_mirror(shared, etcd);
            let v = u64::try_from(revision).unwrap_or(0);
            match entry {
                Some(e) => {
                    let status = if current.is_some() { StatusCode::OK } else { StatusCode::CREATED };
                    with_etag(json_response(status, &entry_json(kind, name, e, v)), v)
                }
                None => json_response(StatusCode::OK, &json!({ "deleted": format!("/{what}"), "revision": revision })),
            }
        }
        Err(WriteError::Conflict) => error(
            StatusCode::CONFLICT,
            format!("{what} was changed on another node since version {expected}: read it again and retry"),
        ),
        Err(WriteError::Unavailable(e)) => {
            error(StatusCode::SERVICE_UNAVAILABLE, format!("the store cannot take writes now: {e}"))
        }
    }
}
