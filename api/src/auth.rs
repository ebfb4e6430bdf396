//! Authentication and tenant binding, when `--auth-file FILE` is given: a TOML file of tokens,
//! each stored as the hex SHA-256 of the token, bound to one tenant (or `"*"`, every tenant)
//! with scopes `read` and/or `write`:
//!
//! ```toml
//! [[token]]
//! sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
//! tenant = "acme"
//! scopes = ["read", "write"]
//! scram_sha256 = "SCRAM-SHA-256$4096:…$…:…"   # optional: PostgreSQL sign-in with SCRAM
//! ```
//!
//! `scram_sha256` is the token's SCRAM-SHA-256 verifier in PostgreSQL's own form (iterations,
//! salt, StoredKey, ServerKey), which `weft token new` prints: with it a PostgreSQL client proves
//! it holds the token without sending it (`sql/scram.rs`). Every verifier uses one salt,
//! [`SCRAM_SALT`]: the server must name the salt before it learns which token the client holds
//! (the user name is free), and tokens are 256 random bits, which no salt needs to protect
//! from guessing.
//!
//! A request acts for the tenant it names (`X-Scope-OrgID`, the PostgreSQL database) or, naming
//! none, for its token's tenant; a token may only name its own tenant (an admin token, any).
//! No or an unknown token is *unauthenticated* (401, `UNAUTHENTICATED`, SQLSTATE 28P01); a
//! known token used for another tenant or without the scope is *forbidden* (403,
//! `PERMISSION_DENIED`, 42501). The file is read again on SIGHUP ([`Auth::reload`]); a file
//! that does not read keeps the tokens in force.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use weft_storage::model::TenantId;

use crate::state::{SharedState, TENANT_HEADER};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Read,
    Write,
}

impl Scope {
    fn name(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Write => "write",
        }
    }
}

/// Why a request is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// No token, or one the file does not list.
    Unauthenticated(String),
    /// A listed token, for another tenant or without the scope.
    Forbidden(String),
}

impl Denied {
    pub fn message(&self) -> &str {
        match self {
            Denied::Unauthenticated(m) | Denied::Forbidden(m) => m,
        }
    }
}

/// The salt and iteration count of every SCRAM verifier (see the module's notes).
pub const SCRAM_SALT: &[u8; 16] = b"weft/token/scram";
pub const SCRAM_ITERATIONS: u32 = 4096;

/// A token's SCRAM-SHA-256 keys (RFC 5802): `StoredKey` checks a client's proof, `ServerKey`
/// signs the server's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScramKeys {
    pub stored: [u8; 32],
    pub server: [u8; 32],
}

/// HMAC-SHA-256.
pub fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let tag = ring::hmac::sign(&ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key), data);
    let mut out = [0u8; 32];
    out.copy_from_slice(tag.as_ref());
    out
}

impl ScramKeys {
    /// The keys of a token, with Weft's salt and iteration count.
    pub fn of_token(token: &str) -> Self {
        let mut salted = [0u8; 32];
        ring::pbkdf2::derive(
            ring::pbkdf2::PBKDF2_HMAC_SHA256,
            std::num::NonZeroU32::new(SCRAM_ITERATIONS).expect("non-zero"),
            SCRAM_SALT,
            token.as_bytes(),
            &mut salted,
        );
        Self {
            stored: Sha256::digest(hmac(&salted, b"Client Key")).into(),
            server: hmac(&salted, b"Server Key"),
        }
    }

    /// PostgreSQL's verifier text: `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`.
    pub fn verifier(&self) -> String {
        use base64::Engine;
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        format!(
            "SCRAM-SHA-256${SCRAM_ITERATIONS}:{}${}:{}",
            b64(SCRAM_SALT),
            b64(&self.stored),
            b64(&self.server)
        )
    }

    /// Reads a verifier made by [`ScramKeys::verifier`].
    pub fn parse(text: &str) -> Result<Self, String> {
        use base64::Engine;
        let bad = || {
            "scram_sha256 must be a verifier as `weft token new` prints it (SCRAM-SHA-256$4096:salt$StoredKey:ServerKey)".to_owned()
        };
        let rest = text.trim().strip_prefix("SCRAM-SHA-256$").ok_or_else(bad)?;
        let (params, keys) = rest.split_once('$').ok_or_else(bad)?;
        let (iterations, salt) = params.split_once(':').ok_or_else(bad)?;
        let (stored, server) = keys.split_once(':').ok_or_else(bad)?;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.decode(s).ok();
        if iterations != SCRAM_ITERATIONS.to_string() || b64(salt).as_deref() != Some(SCRAM_SALT) {
            return Err(format!(
                "scram_sha256 must use Weft's salt and {SCRAM_ITERATIONS} iterations (the server names one salt before it knows the token): make it with `weft token new`"
            ));
        }
        let key = |s: &str| b64(s).and_then(|b| <[u8; 32]>::try_from(b).ok());
        Ok(Self {
            stored: key(stored).ok_or_else(bad)?,
            server: key(server).ok_or_else(bad)?,
        })
    }
}

#[derive(Debug, Clone)]
struct Token {
    sha256: [u8; 32],
    scram: Option<ScramKeys>,
    /// `None`: every tenant.
    tenant: Option<TenantId>,
    read: bool,
    write: bool,
}

#[derive(Deserialize)]
struct FileToken {
    sha256: String,
    tenant: String,
    scopes: Vec<String>,
    scram_sha256: Option<String>,
}

#[derive(Deserialize)]
struct File {
    #[serde(default)]
    token: Vec<FileToken>,
}

/// The tokens in force and the file they came from.
#[derive(Debug)]
pub struct Auth {
    path: PathBuf,
    tokens: RwLock<Arc<Vec<Token>>>,
}

/// The hex SHA-256 of a token, as the auth file stores it.
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

fn read(path: &Path) -> Result<Vec<Token>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read auth file {}: {e}", path.display()))?;
    let file: File =
        toml::from_str(&text).map_err(|e| format!("auth file {}: {e}", path.display()))?;
    file.token
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let at = |m: String| format!("auth file {}, token {}: {m}", path.display(), i + 1);
            let bytes = hex::decode(t.sha256.trim())
                .ok()
                .and_then(|b| <[u8; 32]>::try_from(b).ok())
                .ok_or_else(|| {
                    at("sha256 must be 64 hex digits (the SHA-256 of the token)".into())
                })?;
            let tenant = match t.tenant.trim() {
                "*" => None,
                name => Some(TenantId::new(name).map_err(|e| at(format!("tenant: {e}")))?),
            };
            let (mut read, mut write) = (false, false);
            for s in &t.scopes {
                match s.as_str() {
                    "read" => read = true,
                    "write" => write = true,
                    other => return Err(at(format!("unknown scope {other:?} (read, write)"))),
                }
            }
            if !read && !write {
                return Err(at("scopes must name read and/or write".into()));
            }
            let scram = t
                .scram_sha256
                .as_deref()
                .map(ScramKeys::parse)
                .transpose()
                .map_err(at)?;
            Ok(Token {
                sha256: bytes,
                scram,
                tenant,
                read,
                write,
            })
        })
        .collect()
}

impl Auth {
    pub fn load(path: &Path) -> Result<Self, String> {
        Ok(Self {
            tokens: RwLock::new(Arc::new(read(path)?)),
            path: path.to_owned(),
        })
    }

    /// Reads the file again; on an error the tokens in force stay. Returns how many tokens
    /// are now in force.
    pub fn reload(&self) -> Result<usize, String> {
        let tokens = read(&self.path)?;
        let n = tokens.len();
        *self.tokens.write().expect("auth lock") = Arc::new(tokens);
        Ok(n)
    }

    /// The tenant a request acts for: `named` (a header, a database) or, naming none, the
    /// token's. `scope` `None` asks only for a valid token.
    pub fn authorize(
        &self,
        token: Option<&str>,
        named: Option<&str>,
        scope: Option<Scope>,
    ) -> Result<TenantId, Denied> {
        let Some(token) = token.filter(|t| !t.is_empty()) else {
            return Err(Denied::Unauthenticated(
                "authentication required: send a bearer token".into(),
            ));
        };
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let tokens = self.tokens.read().expect("auth lock").clone();
        // compare with every entry, each in full, so the time taken says nothing of the match
        let mut found = None;
        for t in tokens.iter() {
            if same(&t.sha256, &digest) {
                found = Some(t);
            }
        }
        let found = found.ok_or_else(|| Denied::Unauthenticated("unknown token".into()))?;
        allow(found, named, scope)
    }

    /// Whether any token in force has a SCRAM verifier (PostgreSQL then signs in with
    /// SCRAM-SHA-256 instead of a clear-text password).
    pub fn has_scram(&self) -> bool {
        self.tokens
            .read()
            .expect("auth lock")
            .iter()
            .any(|t| t.scram.is_some())
    }

    /// SCRAM: the token whose `StoredKey` `proves` accepts, authorised like [`Auth::authorize`];
    /// returns the tenant and that token's `ServerKey`.
    pub fn authorize_scram(
        &self,
        proves: impl Fn(&ScramKeys) -> bool,
        named: Option<&str>,
        scope: Option<Scope>,
    ) -> Result<(TenantId, [u8; 32]), Denied> {
        let tokens = self.tokens.read().expect("auth lock").clone();
        let mut found = None;
        for t in tokens.iter() {
            if let Some(keys) = &t.scram
                && proves(keys)
            {
                found = Some((t, keys.server));
            }
        }
        let (found, server) = found.ok_or_else(|| {
            Denied::Unauthenticated(
                "no token with a SCRAM verifier (scram_sha256) matches the password".into(),
            )
        })?;
        Ok((allow(found, named, scope)?, server))
    }
}

/// Constant-time equality of two digests.
pub fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether `found` may act for `named` (or its own tenant) with `scope`.
fn allow(found: &Token, named: Option<&str>, scope: Option<Scope>) -> Result<TenantId, Denied> {
    let named = match named.map(str::trim).filter(|n| !n.is_empty()) {
        Some(n) => {
            Some(TenantId::new(n).map_err(|e| Denied::Forbidden(format!("tenant {n:?}: {e}")))?)
        }
        None => None,
    };
    let tenant = match (&found.tenant, named) {
        (Some(own), Some(n)) if *own != n => {
            return Err(Denied::Forbidden(format!(
                "this token is bound to tenant {own}, not {n}"
            )));
        }
        (Some(own), _) => own.clone(),
        (None, Some(n)) => n,
        (None, None) => TenantId::default_tenant(),
    };
    if let Some(scope) = scope {
        let allowed = match scope {
            Scope::Read => found.read,
            Scope::Write => found.write,
        };
        if !allowed {
            return Err(Denied::Forbidden(format!(
                "this token lacks the {} scope",
                scope.name()
            )));
        }
    }
    Ok(tenant)
}

/// The token of an `Authorization: Bearer …` value.
pub fn bearer(value: Option<&str>) -> Option<&str> {
    let v = value?.trim();
    let (scheme, token) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// HTTP middleware: authorises the request for `scope` and names its tenant in
/// `X-Scope-OrgID` for the handlers. `/ready` and the UI's page stay open; `/metrics` takes any
/// valid token.
pub async fn http(
    State((state, scope)): State<(SharedState, Scope)>,
    mut req: Request,
    next: Next,
) -> Response {
    let Some(auth) = &state.auth else {
        return next.run(req).await;
    };
    let path = req.uri().path();
    // health, and the UI's page itself (its API calls carry the token)
    if path == "/ready" || path == "/" {
        return next.run(req).await;
    }
    let scope = (path != "/metrics").then_some(scope);
    let headers = req.headers();
    let token = bearer(
        headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    );
    let named = headers.get(TENANT_HEADER).and_then(|v| v.to_str().ok());
    match auth.authorize(token, named, scope) {
        Ok(tenant) => {
            if let Ok(v) = HeaderValue::from_str(tenant.as_str()) {
                req.headers_mut().insert(TENANT_HEADER, v);
            }
            next.run(req).await
        }
        Err(denied) => {
            let status = match denied {
                Denied::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
                Denied::Forbidden(_) => StatusCode::FORBIDDEN,
            };
            let mut resp = (
                status,
                axum::Json(serde_json::json!({ "error": denied.message() })),
            )
                .into_response();
            if status == StatusCode::UNAUTHORIZED {
                resp.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"weft\""),
                );
            }
            resp
        }
    }
}

/// gRPC: authorises a call for writing (the `authorization` metadata) and names its tenant
/// in `x-scope-orgid`.
#[derive(Clone)]
pub struct GrpcAuth(pub Option<Arc<Auth>>);

impl tonic::service::Interceptor for GrpcAuth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let Some(auth) = &self.0 else {
            return Ok(req);
        };
        let md = req.metadata();
        let token = bearer(md.get("authorization").and_then(|v| v.to_str().ok()));
        let named = md.get(TENANT_HEADER).and_then(|v| v.to_str().ok());
        match auth.authorize(token, named, Some(Scope::Write)) {
            Ok(tenant) => {
                if let Ok(v) = tenant.as_str().parse() {
                    req.metadata_mut().insert(TENANT_HEADER, v);
                }
                Ok(req)
            }
            Err(Denied::Unauthenticated(m)) => Err(tonic::Status::unauthenticated(m)),
            Err(Denied::Forbidden(m)) => Err(tonic::Status::permission_denied(m)),
        }
    }
}

/// A fresh token (256 random bits, hex) and the lines that add it to an auth file.
pub fn new_token(tenant: &str, scopes: &[String]) -> Result<(String, String), String> {
    if tenant != "*" {
        TenantId::new(tenant).map_err(|e| format!("--tenant: {e}"))?;
    }
    for s in scopes {
        if s != "read" && s != "write" {
            return Err(format!("--scopes: unknown scope {s:?} (read, write)"));
        }
    }
    if scopes.is_empty() {
        return Err("--scopes: name read and/or write".into());
    }
    let token = hex::encode(rand::random::<[u8; 32]>());
    let lines = format!(
        "[[token]]\nsha256 = \"{}\"\ntenant = \"{tenant}\"\nscopes = [{}]\nscram_sha256 = \"{}\"\n",
        token_hash(&token),
        scopes
            .iter()
            .map(|s| format!("\"{s}\""))
            .collect::<Vec<_>>()
            .join(", "),
        ScramKeys::of_token(&token).verifier()
    );
    Ok((token, lines))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(text: &str) -> Result<Auth, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auth.toml");
        std::fs::write(&path, text).unwrap();
        Auth::load(&path)
    }

    #[test]
    fn tokens_bind_tenants_and_scopes() {
        let (rw, rw_lines) = new_token("acme", &["read".into(), "write".into()]).unwrap();
        let (ro, ro_lines) = new_token("acme", &["read".into()]).unwrap();
        let (admin, admin_lines) = new_token("*", &["read".into(), "write".into()]).unwrap();
        let a = auth(&format!("{rw_lines}\n{ro_lines}\n{admin_lines}")).unwrap();
        let acme = TenantId::new("acme").unwrap();
        assert_eq!(
            a.authorize(Some(&rw), None, Some(Scope::Write)),
            Ok(acme.clone())
        );
        assert_eq!(
            a.authorize(Some(&rw), Some("acme"), Some(Scope::Read)),
            Ok(acme.clone())
        );
        assert!(matches!(
            a.authorize(Some(&rw), Some("globex"), Some(Scope::Read)),
            Err(Denied::Forbidden(m)) if m.contains("acme")
        ));
        assert!(matches!(
            a.authorize(Some(&ro), None, Some(Scope::Write)),
            Err(Denied::Forbidden(m)) if m.contains("write")
        ));
        assert_eq!(a.authorize(Some(&ro), None, None), Ok(acme));
        assert_eq!(
            a.authorize(Some(&admin), Some("globex"), Some(Scope::Write)),
            Ok(TenantId::new("globex").unwrap())
        );
        assert_eq!(
            a.authorize(Some(&admin), None, Some(Scope::Read)),
            Ok(TenantId::default_tenant())
        );
        for bad in [None, Some(""), Some("nope"), Some(&rw[..63])] {
            assert!(matches!(
                a.authorize(bad, None, Some(Scope::Read)),
                Err(Denied::Unauthenticated(_))
            ));
        }
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
    }

    #[test]
    fn a_bad_file_is_refused_with_the_reason() {
        for (text, part) in [
            (
                "[[token]]\nsha256 = \"12\"\ntenant = \"a\"\nscopes = [\"read\"]",
                "64 hex",
            ),
            (
                &format!(
                    "[[token]]\nsha256 = \"{}\"\ntenant = \"a\"\nscopes = [\"admin\"]",
                    "0".repeat(64)
                ),
                "unknown scope",
            ),
            (
                &format!(
                    "[[token]]\nsha256 = \"{}\"\ntenant = \"a\"\nscopes = []",
                    "0".repeat(64)
                ),
                "read and/or write",
            ),
            ("[[token]]\nsha256 = 5", "auth file"),
        ] {
            let e = auth(text).unwrap_err();
            assert!(e.contains(part), "{text}: {e}");
        }
        // the documented example: the SHA-256 of "test"
        assert_eq!(
            token_hash("test"),
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
    }
}
