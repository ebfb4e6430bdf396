//! A minimal PostgreSQL wire client for the benchmarks and tests: start-up with no password, a
//! clear-text one or SCRAM-SHA-256 (the server's signature checked), then simple queries,
//! counting the data rows of the answer (framing read, values not decoded).

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

pub struct PgClient {
    stream: BufReader<TcpStream>,
    /// How the server had this client sign in: `trust`, `password` or `scram-sha-256`.
    pub signed_in_with: &'static str,
    /// The notices of the last query (`SQLSTATE: message`).
    pub notices: Vec<String>,
}

impl PgClient {
    pub async fn connect(addr: &str, database: &str) -> anyhow::Result<Self> {
        Self::connect_with(addr, database, None).await
    }

    /// Connects, answering a clear-text password or SCRAM-SHA-256 request with `password` (a
    /// token); a refusal says its SQLSTATE first (`28P01: …`).
    pub async fn connect_with(
        addr: &str,
        database: &str,
        password: Option<&str>,
    ) -> anyhow::Result<Self> {
        let stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connect {addr}"))?;
        stream.set_nodelay(true)?;
        let mut c = Self {
            stream: BufReader::new(stream),
            signed_in_with: "trust",
            notices: Vec::new(),
        };
        let mut body = Vec::new();
        body.extend_from_slice(&196_608i32.to_be_bytes()); // protocol 3.0
        for (k, v) in [("user", "bench"), ("database", database)] {
            body.extend_from_slice(k.as_bytes());
            body.push(0);
            body.extend_from_slice(v.as_bytes());
            body.push(0);
        }
        body.push(0);
        let mut msg = ((body.len() + 4) as i32).to_be_bytes().to_vec();
        msg.extend_from_slice(&body);
        c.stream.get_mut().write_all(&msg).await?;
        let mut scram: Option<Scram> = None;
        loop {
            let (tag, payload) = c.read_message().await?;
            let code = payload
                .get(..4)
                .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]));
            match tag {
                b'R' if code == Some(0) => {}
                // SASL: the mechanisms offered
                b'R' if code == Some(10) && password.is_some() => {
                    let offered = String::from_utf8_lossy(&payload[4..]).into_owned();
                    if !offered.split('\0').any(|m| m == "SCRAM-SHA-256") {
                        bail!("the server offers no SASL mechanism this client knows: {offered:?}");
                    }
                    let s = Scram::new(password.unwrap_or_default());
                    let first = s.client_first();
                    let mut body = b"SCRAM-SHA-256\0".to_vec();
                    body.extend_from_slice(&(first.len() as i32).to_be_bytes());
                    body.extend_from_slice(first.as_bytes());
                    c.send(b'p', &body).await?;
                    scram = Some(s);
                    c.signed_in_with = "scram-sha-256";
                }
                b'R' if code == Some(11) => {
                    let s = scram.as_mut().context("SASLContinue before SASL")?;
                    let last = s.client_final(&String::from_utf8_lossy(&payload[4..]))?;
                    c.send(b'p', last.as_bytes()).await?;
                }
                b'R' if code == Some(12) => {
                    let s = scram.as_ref().context("SASLFinal before SASL")?;
                    s.check_server(&String::from_utf8_lossy(&payload[4..]))?;
                }
                b'R' if payload.get(..4) == Some(&[0, 0, 0, 3]) && password.is_some() => {
                    let pw = password.unwrap_or_default();
                    let mut msg = vec![b'p'];
                    msg.extend_from_slice(&((pw.len() + 5) as i32).to_be_bytes());
                    msg.extend_from_slice(pw.as_bytes());
                    msg.push(0);
                    c.stream.get_mut().write_all(&msg).await?;
                    c.signed_in_with = "password";
                }
                b'R' => bail!("the server asks for a password this client cannot give"),
                b'E' => bail!("start-up refused: {}", error_text(&payload)),
                b'Z' => return Ok(c),
                _ => {}
            }
        }
    }

    async fn send(&mut self, tag: u8, body: &[u8]) -> anyhow::Result<()> {
        let mut msg = vec![tag];
        msg.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        msg.extend_from_slice(body);
        self.stream.get_mut().write_all(&msg).await?;
        Ok(())
    }

    async fn read_message(&mut self) -> anyhow::Result<(u8, Vec<u8>)> {
        let tag = self.stream.read_u8().await?;
        let len = self.stream.read_i32().await? as usize;
        let mut payload = vec![0; len.saturating_sub(4)];
        self.stream.read_exact(&mut payload).await?;
        Ok((tag, payload))
    }

    /// Runs one simple query; returns the number of data rows.
    pub async fn query(&mut self, sql: &str) -> anyhow::Result<usize> {
        let mut msg = vec![b'Q'];
        msg.extend_from_slice(&((sql.len() + 5) as i32).to_be_bytes());
        msg.extend_from_slice(sql.as_bytes());
        msg.push(0);
        self.stream.get_mut().write_all(&msg).await?;
        let mut rows = 0;
        let mut error = None;
        self.notices.clear();
        loop {
            let (tag, payload) = self.read_message().await?;
            match tag {
                b'D' => rows += 1,
                b'N' => self.notices.push(error_text(&payload)),
                b'E' => error = Some(error_text(&payload)),
                b'Z' => break,
                _ => {}
            }
        }
        match error {
            Some(e) => bail!("{e}"),
            None => Ok(rows),
        }
    }
}

/// The client side of SCRAM-SHA-256 (RFC 5802), without channel binding.
struct Scram {
    password: String,
    nonce: String,
    /// Set once the server's first message is answered.
    auth_message: String,
    salted: [u8; 32],
}

fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let tag = ring::hmac::sign(&ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key), data);
    let mut out = [0u8; 32];
    out.copy_from_slice(tag.as_ref());
    out
}

impl Scram {
    fn new(password: &str) -> Self {
        use base64::Engine;
        Self {
            password: password.to_owned(),
            nonce: base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 18]>()),
            auth_message: String::new(),
            salted: [0; 32],
        }
    }

    fn client_first(&self) -> String {
        format!("n,,n=,r={}", self.nonce)
    }

    fn client_final(&mut self, server_first: &str) -> anyhow::Result<String> {
        use base64::Engine;
        use sha2::Digest;
        let b64 = base64::engine::general_purpose::STANDARD;
        let attr = |k: &str| {
            server_first
                .split(',')
                .find_map(|a| a.strip_prefix(k))
                .with_context(|| format!("server-first without {k}: {server_first}"))
        };
        let nonce = attr("r=")?;
        if !nonce.starts_with(&self.nonce) {
            bail!("the server's nonce does not extend ours");
        }
        let salt = b64.decode(attr("s=")?).context("salt is not base64")?;
        let iterations: u32 = attr("i=")?.parse().context("iterations")?;
        ring::pbkdf2::derive(
            ring::pbkdf2::PBKDF2_HMAC_SHA256,
            std::num::NonZeroU32::new(iterations).context("zero iterations")?,
            &salt,
            self.password.as_bytes(),
            &mut self.salted,
        );
        let without_proof = format!("c=biws,r={nonce}");
        self.auth_message = format!("n=,r={},{server_first},{without_proof}", self.nonce);
        let client_key = hmac(&self.salted, b"Client Key");
        let stored = sha2::Sha256::digest(client_key);
        let signature = hmac(&stored, self.auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(signature)
            .map(|(k, s)| k ^ s)
            .collect();
        Ok(format!("{without_proof},p={}", b64.encode(proof)))
    }

    fn check_server(&self, server_final: &str) -> anyhow::Result<()> {
        use base64::Engine;
        let expected = hmac(
            &hmac(&self.salted, b"Server Key"),
            self.auth_message.as_bytes(),
        );
        let got = server_final
            .strip_prefix("v=")
            .context("server-final without v=")?;
        if got != base64::engine::general_purpose::STANDARD.encode(expected) {
            bail!("the server's SCRAM signature is wrong: it does not hold this token's verifier");
        }
        Ok(())
    }
}

fn error_text(payload: &[u8]) -> String {
    let field = |tag: u8| {
        payload
            .split(|b| *b == 0)
            .filter(|f| f.first() == Some(&tag))
            .map(|f| String::from_utf8_lossy(&f[1..]).into_owned())
            .next()
    };
    let message = field(b'M').unwrap_or_else(|| "unknown error".into());
    match field(b'C') {
        Some(code) => format!("{code}: {message}"),
        None => message,
    }
}
