//! A minimal PostgreSQL wire client for the benchmarks: start-up without a password, then
//! simple queries, counting the data rows of the answer (framing read, values not decoded).

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

pub struct PgClient {
    stream: BufReader<TcpStream>,
}

impl PgClient {
    pub async fn connect(addr: &str, database: &str) -> anyhow::Result<Self> {
        Self::connect_with(addr, database, None).await
    }

    /// Connects, answering a cleartext password request with `password` (a token); a refusal
    /// says its SQLSTATE first (`28P01: …`).
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
        loop {
            let (tag, payload) = c.read_message().await?;
            match tag {
                b'R' if payload.get(..4) == Some(&[0, 0, 0, 0]) => {}
                b'R' if payload.get(..4) == Some(&[0, 0, 0, 3]) && password.is_some() => {
                    let pw = password.unwrap_or_default();
                    let mut msg = vec![b'p'];
                    msg.extend_from_slice(&((pw.len() + 5) as i32).to_be_bytes());
                    msg.extend_from_slice(pw.as_bytes());
                    msg.push(0);
                    c.stream.get_mut().write_all(&msg).await?;
                }
                b'R' => bail!("the server asks for a password this client cannot give"),
                b'E' => bail!("start-up refused: {}", error_text(&payload)),
                b'Z' => return Ok(c),
                _ => {}
            }
        }
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
        loop {
            let (tag, payload) = self.read_message().await?;
            match tag {
                b'D' => rows += 1,
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
