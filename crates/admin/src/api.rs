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
use gatehouse_node::store::WriteError;
use gatehouse_node::{Change, Expect, Node};
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::{Value, json};

use crate::{Body, error, json_response, not_allowed};

/// Largest request body the API reads.
const MAX_BODY: usize = 1 << 20;

fn with_etag(mut r: Response<Body>, version: u64) -> Response<Body> {
    if let Ok(v) = HeaderValue::from_str(&format!("\"{version}\"")) {
        r.headers_mut().insert(header::ETAG, v);
    }
    r
}

/// A resource's path in the API: `/routes/NAME`, or for a peer
/// `/wireguard/interfaces/INTERFACE/peers/NAME`.
fn path_of(kind: &str, full: &str) -> String {
    match doc::locate(kind, full) {
        doc::Location { scope: Some(iface), name } => format!("/wireguard/interfaces/{iface}/peers/{name}"),
        _ => format!("/{kind}/{full}"),
    }
}

fn entry_json(kind: &str, full: &str, value: Value, version: u64) -> Value {
    json!({ "key": path_of(kind, full), "value": value, "modifiedIndex": version })
}

/// What `If-Match` asks for.
fn precondition(req: &Request<Incoming>) -> Result<Expect, Response<Body>> {
    let Some(v) = req.headers().get(header::IF_MATCH) else { return Ok(Expect::Nothing) };
    let text = v.to_str().unwrap_or("").trim();
    if text == "*" {
        return Ok(Expect::Exists);
    }
    text.trim_start_matches("W/").trim_matches('"').parse::<u64>().map(Expect::Version).map_err(|_| {
        error(StatusCode::BAD_REQUEST, format!("If-Match: expected a version such as \"7\" or *, found {text:?}"))
    })
}

async fn read_json(req: Request<Incoming>) -> Result<Value, Response<Body>> {
    let body = Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| error(StatusCode::BAD_REQUEST, format!("cannot read the request body: {e}")))?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|e| error(StatusCode::BAD_REQUEST, format!("invalid JSON: {e}")))
}

/// A refused write as the API answers it: 400 with every error's path
/// (and, for an error inside the resource written, its path there as
/// `field`), 404, 409, 503 or 500.
fn refused(e: WriteError) -> Response<Body> {
    match e {
        WriteError::Invalid { errors, within } => {
            let prefix = within;
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
        WriteError::BadEntry { path: Some(path), message } => json_response(
            StatusCode::BAD_REQUEST,
            &json!({
                "error_msg": format!("{path}: {message}"),
                "errors": [{ "path": path, "field": path, "message": message }],
            }),
        ),
        WriteError::BadEntry { path: None, message } => error(StatusCode::BAD_REQUEST, message),
        WriteError::NotFound(m) => error(StatusCode::NOT_FOUND, m),
        WriteError::Conflict(m) => error(StatusCode::CONFLICT, m),
        WriteError::Unavailable(m) => error(StatusCode::SERVICE_UNAVAILABLE, m),
        WriteError::Failed(m) => error(StatusCode::INTERNAL_SERVER_ERROR, m),
    }
}

/// `POST /config/reload`: reads the config file again and applies it, as
/// SIGHUP does; answers the new version, or the errors with their paths
/// (the running config stays).
pub fn reload(req: Request<Incoming>, node: &Node) -> Response<Body> {
    if req.method() != Method::POST {
        return not_allowed("POST");
    }
    match node.reload() {
        Ok(version) => with_etag(json_response(StatusCode::OK, &json!({ "version": version })), version),
        Err(e) => refused(e.into_write_error(None)),
    }
}

/// `/config`: the whole document.
pub async fn config(req: Request<Incoming>, node: &Node) -> Response<Body> {
    match *req.method() {
        Method::GET | Method::HEAD => {
            let control = node.control();
            let version = node.running().version;
            with_etag(
                json_response(StatusCode::OK, &json!({ "version": version, "value": doc::to_json(&control.doc) })),
                version,
            )
        }
        Method::PUT => {
            let expect = match precondition(&req) {
                Ok(p) => p,
                Err(r) => return r,
            };
            let body = match read_json(req).await {
                Ok(Value::Object(m)) => Value::Object(m),
                Ok(_) => return error(StatusCode::BAD_REQUEST, "expected a JSON object: the whole config"),
                Err(r) => return r,
            };
            match node.replace_document(doc::from_json(&body), expect).await {
                Ok(version) => {
                    with_etag(json_response(StatusCode::OK, &json!({ "version": version, "value": body })), version)
                }
                Err(e) => refused(e),
            }
        }
        _ => not_allowed("GET, HEAD, PUT"),
    }
}

/// `/ha`: the node's active/standby role. GET shows it; PUT with
/// `{"role": "master"}` (or `backup`, `fault`) sets it, as keepalived's
/// notify does through `gatehouse ha`.
pub async fn ha(req: Request<Incoming>, node: &Node) -> Response<Body> {
    let show = |h: gatehouse_node::HaState| {
        let since = h.since.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        json!({ "role": h.role.name(), "since": since, "changes": h.changes })
    };
    match *req.method() {
        Method::GET | Method::HEAD => match node.ha() {
            Some(h) => json_response(StatusCode::OK, &show(h)),
            None => error(StatusCode::NOT_FOUND, gatehouse_node::HaError.to_string()),
        },
        Method::PUT => {
            let body = match read_json(req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            let Some(text) = body.get("role").and_then(Value::as_str) else {
                return error(StatusCode::BAD_REQUEST, "role: expected \"master\", \"backup\" or \"fault\"");
            };
            let Some(role) = gatehouse_config::HaRole::parse(text) else {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("role: {text:?} is not a role: expected \"master\", \"backup\" or \"fault\""),
                );
            };
            match node.set_ha_role(role) {
                Ok(h) => json_response(StatusCode::OK, &show(h)),
                Err(e) => error(StatusCode::CONFLICT, e.to_string()),
            }
        }
        _ => not_allowed("GET, HEAD, PUT"),
    }
}

/// `/drain`: the node's VIPs withdrawn from the routers while it keeps
/// serving (traffic moves to the other nodes; established connections
/// finish here). GET shows the `bgp` status; POST drains; DELETE announces
/// again by health.
pub fn drain(req: Request<Incoming>, node: &Node) -> Response<Body> {
    let drained = match *req.method() {
        Method::GET | Method::HEAD => None,
        Method::POST | Method::PUT => Some(true),
        Method::DELETE => Some(false),
        _ => return not_allowed("GET, HEAD, POST, DELETE"),
    };
    if let Some(d) = drained
        && !node.set_drained(d)
    {
        return error(StatusCode::CONFLICT, "the config has no bgp section: this node announces nothing to withdraw");
    }
    match node.bgp.status() {
        Some(s) => json_response(StatusCode::OK, &s),
        None => error(StatusCode::NOT_FOUND, "the config has no bgp section"),
    }
}

/// `/{kind}` and `/{kind}/{name}`; for peers (`scope`: the interface)
/// `/wireguard/interfaces/{scope}/peers` and `.../peers/{name}`.
pub async fn resource(
    req: Request<Incoming>,
    node: &Node,
    kind: &'static str,
    scope: Option<&str>,
    name: Option<String>,
) -> Response<Body> {
    if kind == doc::PEERS && !doc::interface_names(&node.control().doc).iter().any(|i| Some(i.as_str()) == scope) {
        return error(StatusCode::NOT_FOUND, format!("no WireGuard interface {:?}", scope.unwrap_or_default()));
    }
    let Some(name) = name else {
        if !matches!(*req.method(), Method::GET | Method::HEAD) {
            return not_allowed("GET, HEAD");
        }
        let control = node.control();
        let full = |n: &str| scope.map_or_else(|| n.to_string(), |s| format!("{s}/{n}"));
        let list: Vec<Value> = doc::entries(&control.doc, kind, scope)
            .iter()
            .filter_map(|e| {
                let n = full(doc::entry_name(kind, e)?);
                let v = control.versions.get(&(kind, n.clone())).copied().unwrap_or(0);
                Some(entry_json(kind, &n, doc::to_json(e), v))
            })
            .collect();
        let version = node.running().version;
        return with_etag(json_response(StatusCode::OK, &json!({ "total": list.len(), "list": list })), version);
    };
    let name = scope.map_or(name.clone(), |s| format!("{s}/{name}"));
    let what = format!("{kind}/{name}");
    let expect = match precondition(&req) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let change = match *req.method() {
        Method::GET | Method::HEAD => {
            let control = node.control();
            let loc = doc::locate(kind, &name);
            let Some(entry) =
                doc::entries(&control.doc, kind, loc.scope).iter().find(|e| doc::entry_name(kind, e) == Some(loc.name))
            else {
                return error(StatusCode::NOT_FOUND, format!("no {what}"));
            };
            let v = control.versions.get(&(kind, name.clone())).copied().unwrap_or(0);
            return with_etag(json_response(StatusCode::OK, &entry_json(kind, &name, doc::to_json(entry), v)), v);
        }
        Method::PUT | Method::PATCH => {
            let patch = req.method() == Method::PATCH;
            match read_json(req).await {
                Ok(Value::Object(fields)) => Change::Put { fields, patch },
                Ok(_) => {
                    return error(StatusCode::BAD_REQUEST, format!("expected a JSON object: the fields of {what}"));
                }
                Err(r) => return r,
            }
        }
        Method::DELETE => Change::Delete,
        _ => return not_allowed("GET, HEAD, PUT, PATCH, DELETE"),
    };
    match node.write_resource(kind, &name, change, expect).await {
        Ok(w) => match w.entry {
            Some(entry) => {
                let status = if w.created { StatusCode::CREATED } else { StatusCode::OK };
                with_etag(json_response(status, &entry_json(kind, &name, entry, w.version)), w.version)
            }
            None => json_response(
                StatusCode::OK,
                &json!({ "deleted": path_of(kind, &name), node.store().version_name(): w.version }),
            ),
        },
        Err(e) => refused(e),
    }
}
