//! SCRAM-SHA-256 (RFC 5802, RFC 7677, as PostgreSQL speaks it) over the auth file's tokens: the
//! PostgreSQL password is a token, and the client proves it holds one without sending it.
//!
//! The user name is free, so the server cannot look a verifier up by user: it names Weft's one
//! salt ([`SCRAM_SALT`]) in its first message and, given the client's proof, finds the token
//! whose `StoredKey` the proof opens (`H(proof XOR HMAC(StoredKey, AuthMessage)) = StoredKey`),
//! then checks that token's tenant and scope as every other surface does. Channel binding
//! (`SCRAM-SHA-256-PLUS`) is not offered; a client that asks for it (`p=`) is refused, and one
//! that could but saw it was not offered (`y`) is accepted, as RFC 5802 says.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use pgwire::api::ClientInfo;
use pgwire::api::auth::mechanism::{AuthMechanism, AuthState};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::startup::{Authentication, PasswordMessageFamily, SASLInitialResponse};
use sha2::{Digest, Sha256};

use crate::auth::{Auth, Denied, SCRAM_ITERATIONS, SCRAM_SALT, Scope, ScramKeys, hmac, same};

pub const METHOD: &str = "SCRAM-SHA-256";

/// One connection's SCRAM exchange.
pub struct TokenScram {
    auth: Arc<Auth>,
    step: Step,
}

enum Step {
    /// Waiting for the client-first message.
    Start,
    /// The server-first message is sent; waiting for the client-final message.
    Challenged {
        gs2_header: String,
        client_first_bare: String,
        server_first: String,
        nonce: String,
    },
}

impl TokenScram {
    pub fn new(auth: Arc<Auth>) -> Self {
        Self {
            auth,
            step: Step::Start,
        }
    }
}

fn malformed(what: &str) -> PgWireError {
    PgWireError::InvalidScramMessage(what.to_owned())
}

/// The `SASLInitialResponse` a password message carries, read within the message: pgwire's own
/// reader trusts the data length inside it and panics when the message is shorter.
pub fn sasl_initial(message: PasswordMessageFamily) -> PgWireResult<SASLInitialResponse> {
    let PasswordMessageFamily::Raw(body) = message else {
        return message.into_sasl_initial_response();
    };
    let mut fields = crate::sql::wire::Fields::new(&body, "SASLInitialResponse");
    let bad = |m: crate::sql::wire::Malformed| PgWireError::InvalidScramMessage(m.0);
    let method = String::from_utf8_lossy(fields.cstr().map_err(bad)?).into_owned();
    let data = match fields.i32().map_err(bad)? {
        -1 => None,
        n if n < 0 => return Err(malformed("SASLInitialResponse: a negative data length")),
        n => Some(Bytes::copy_from_slice(
            fields.take(n as usize, "its data").map_err(bad)?,
        )),
    };
    fields.end().map_err(bad)?;
    Ok(SASLInitialResponse::new(method, data))
}

/// The client-first message: (gs2 header, client-first-message-bare, client nonce).
pub fn client_first(data: &[u8]) -> PgWireResult<(String, String, String)> {
    let text = std::str::from_utf8(data).map_err(|_| malformed("client-first is not UTF-8"))?;
    let (flag, rest) = text
        .split_once(',')
        .ok_or_else(|| malformed("client-first has no GS2 header"))?;
    match flag {
        "n" | "y" => {}
        f if f.starts_with("p=") => {
            return Err(malformed(
                "channel binding (SCRAM-SHA-256-PLUS) is not offered by this server",
            ));
        }
        _ => return Err(malformed("client-first: GS2 flag must be n, y or p=")),
    }
    let (authzid, bare) = rest
        .split_once(',')
        .ok_or_else(|| malformed("client-first has no GS2 header"))?;
    let mut attrs = bare.split(',');
    match attrs.next() {
        Some(a) if a.starts_with("m=") => {
            return Err(malformed(
                "client-first: mandatory extensions are not supported",
            ));
        }
        Some(a) if a.starts_with("n=") => {}
        _ => return Err(malformed("client-first: the user (n=) must come first")),
    }
    let nonce = attrs
        .next()
        .and_then(|a| a.strip_prefix("r="))
        .filter(|n| !n.is_empty() && n.bytes().all(|b| (0x21..=0x7e).contains(&b)))
        .ok_or_else(|| malformed("client-first: r= (a printable nonce) must follow n="))?;
    Ok((
        format!("{flag},{authzid},"),
        bare.to_owned(),
        nonce.to_owned(),
    ))
}

/// The client-final message: (client-final-message-without-proof, channel binding, nonce,
/// proof).
pub fn client_final(data: &[u8]) -> PgWireResult<(String, String, String, [u8; 32])> {
    let text = std::str::from_utf8(data).map_err(|_| malformed("client-final is not UTF-8"))?;
    let (without_proof, proof) = text
        .rsplit_once(",p=")
        .ok_or_else(|| malformed("client-final has no proof (p=)"))?;
    let mut attrs = without_proof.split(',');
    let binding = attrs
        .next()
        .and_then(|a| a.strip_prefix("c="))
        .ok_or_else(|| malformed("client-final: c= must come first"))?;
    let nonce = attrs
        .next()
        .and_then(|a| a.strip_prefix("r="))
        .ok_or_else(|| malformed("client-final: r= must follow c="))?;
    let proof = B64
        .decode(proof)
        .ok()
        .and_then(|p| <[u8; 32]>::try_from(p).ok())
        .ok_or_else(|| malformed("client-final: the proof is not 32 bytes of base64"))?;
    Ok((
        without_proof.to_owned(),
        binding.to_owned(),
        nonce.to_owned(),
        proof,
    ))
}

/// Whether `proof` shows knowledge of the token behind `keys` for `auth_message`.
pub fn proves(keys: &ScramKeys, auth_message: &[u8], proof: &[u8; 32]) -> bool {
    let signature = hmac(&keys.stored, auth_message);
    let mut client_key = [0u8; 32];
    for (k, (p, s)) in client_key.iter_mut().zip(proof.iter().zip(signature)) {
        *k = p ^ s;
    }
    let stored: [u8; 32] = Sha256::digest(client_key).into();
    same(&stored, &keys.stored)
}

#[async_trait::async_trait]
impl AuthMechanism for TokenScram {
    async fn begin(&mut self, _client: &(dyn ClientInfo + Send + Sync)) -> PgWireResult<AuthState> {
        Ok(AuthState::InProgress(Authentication::SASL(vec![
            METHOD.to_owned(),
        ])))
    }

    async fn next(
        &mut self,
        client: &(dyn ClientInfo + Send + Sync),
        message: PasswordMessageFamily,
    ) -> PgWireResult<AuthState> {
        match std::mem::replace(&mut self.step, Step::Start) {
            Step::Start => {
                let initial = sasl_initial(message)?;
                if initial.auth_method != METHOD {
                    return Err(PgWireError::UnsupportedSASLAuthMethod(initial.auth_method));
                }
                let data = initial
                    .data
                    .ok_or_else(|| malformed("SASLInitialResponse without data"))?;
                let (gs2_header, client_first_bare, client_nonce) = client_first(&data)?;
                let nonce = format!("{client_nonce}{}", B64.encode(rand::random::<[u8; 18]>()));
                let server_first = format!(
                    "r={nonce},s={},i={SCRAM_ITERATIONS}",
                    B64.encode(SCRAM_SALT)
                );
                let reply = Authentication::SASLContinue(Bytes::from(server_first.clone()));
                self.step = Step::Challenged {
                    gs2_header,
                    client_first_bare,
                    server_first,
                    nonce,
                };
                Ok(AuthState::InProgress(reply))
            }
            Step::Challenged {
                gs2_header,
                client_first_bare,
                server_first,
                nonce,
            } => {
                let response = message.into_sasl_response()?;
                let (without_proof, binding, final_nonce, proof) = client_final(&response.data)?;
                if binding != B64.encode(gs2_header.as_bytes()) {
                    return Err(malformed(
                        "client-final: channel binding does not match the GS2 header",
                    ));
                }
                if final_nonce != nonce {
                    return Err(malformed("client-final: the nonce is not the server's"));
                }
                let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
                let database = client.metadata().get("database").map(String::as_str);
                let tenant = super::pg::tenant_of_database(database)
                    .map_err(|e| super::pg::user_error("FATAL", "3D000", e))?;
                let user = client.metadata().get("user").cloned().unwrap_or_default();
                match self.auth.authorize_scram(
                    |keys| proves(keys, auth_message.as_bytes(), &proof),
                    Some(tenant.as_str()),
                    Some(Scope::Read),
                ) {
                    Ok((_, server_key)) => {
                        let signature = hmac(&server_key, auth_message.as_bytes());
                        let last = format!("v={}", B64.encode(signature));
                        Ok(AuthState::Ok {
                            final_message: Some(Authentication::SASLFinal(Bytes::from(last))),
                            identity: None,
                        })
                    }
                    Err(Denied::Unauthenticated(_)) => Err(PgWireError::InvalidPassword(user)),
                    Err(Denied::Forbidden(m)) => Err(super::pg::user_error("FATAL", "42501", m)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client side of the exchange, as libpq computes it.
    fn client_proof(token: &str, auth_message: &str) -> [u8; 32] {
        let mut salted = [0u8; 32];
        ring::pbkdf2::derive(
            ring::pbkdf2::PBKDF2_HMAC_SHA256,
            std::num::NonZeroU32::new(SCRAM_ITERATIONS).unwrap(),
            SCRAM_SALT,
            token.as_bytes(),
            &mut salted,
        );
        let client_key = hmac(&salted, b"Client Key");
        let stored: [u8; 32] = Sha256::digest(client_key).into();
        let signature = hmac(&stored, auth_message.as_bytes());
        let mut proof = [0u8; 32];
        for i in 0..32 {
            proof[i] = client_key[i] ^ signature[i];
        }
        proof
    }

    #[test]
    fn a_proof_opens_only_its_own_token() {
        let keys = ScramKeys::of_token("alpha");
        let msg = "n=u,r=abc,r=abcdef,s=c2FsdA==,i=4096,c=biws,r=abcdef";
        assert!(proves(&keys, msg.as_bytes(), &client_proof("alpha", msg)));
        assert!(!proves(&keys, msg.as_bytes(), &client_proof("beta", msg)));
        assert!(!proves(
            &keys,
            b"another message",
            &client_proof("alpha", msg)
        ));
        assert_eq!(ScramKeys::parse(&keys.verifier()).unwrap(), keys);
    }

    #[test]
    fn messages_are_parsed_and_bad_ones_named() {
        let (gs2, bare, nonce) = client_first(b"n,,n=grafana,r=fyko+d2lbbFgONRv9qkxdawL").unwrap();
        assert_eq!(gs2, "n,,");
        assert_eq!(bare, "n=grafana,r=fyko+d2lbbFgONRv9qkxdawL");
        assert_eq!(nonce, "fyko+d2lbbFgONRv9qkxdawL");
        assert!(client_first(b"y,,n=,r=abc").is_ok());
        for bad in [
            &b"p=tls-server-end-point,,n=,r=abc"[..],
            b"x,,n=,r=abc",
            b"n,,r=abc",
            b"n,,n=u",
            b"n,,m=ext,n=u,r=abc",
            b"n",
            b"\xff,,",
        ] {
            assert!(client_first(bad).is_err(), "{bad:?}");
        }
        let proof = B64.encode([7u8; 32]);
        let (without, binding, nonce, p) =
            client_final(format!("c=biws,r=abc,p={proof}").as_bytes()).unwrap();
        assert_eq!(
            (without.as_str(), binding.as_str(), nonce.as_str(), p),
            ("c=biws,r=abc", "biws", "abc", [7u8; 32])
        );
        assert!(client_final(b"c=biws,r=abc").is_err());
        assert!(client_final(b"c=biws,r=abc,p=AAAA").is_err());
        assert!(client_final(b"r=abc,c=biws,p=AAAA").is_err());
    }
}
