//! The PostgreSQL wire protocol endpoint (`--pg-listen`, default 127.0.0.1:5433): psql,
//! psycopg, asyncpg, JDBC, DBeaver and Grafana's PostgreSQL data source talk to Weft's SQL
//! engine through it.
//!
//! - The database name is the tenant (`weft` and `postgres` stand for the default tenant).
//! - Simple and extended query protocols; text and binary results with PostgreSQL's type OIDs.
//! - Only reads: `BEGIN`/`COMMIT`/`ROLLBACK`, `SET` and `DISCARD` are accepted as no-ops so
//!   that drivers can run their usual session set-up; everything else that writes is refused.
//! - Every frontend message is checked against its type's layout before pgwire decodes it
//!   (`sql/wire.rs`); a malformed one ends the connection with FATAL 08P01 naming the fault.
//! - With `--tls-cert`, connections must negotiate TLS (`SSLRequest`, or direct TLS with ALPN
//!   `postgresql`); others are refused at start-up.
//! - With `--auth-file`, the password is a token, proven with SCRAM-SHA-256 when the auth file
//!   carries SCRAM verifiers (`sql/scram.rs`; else sent in clear: use TLS beyond loopback), that
//!   must be allowed to read the database's tenant (28P01 for no or an unknown token, 42501 for
//!   another tenant's or one without the read scope). Else with `--pg-password`, clients
//!   authenticate with md5; otherwise any user is accepted.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use datafusion::common::ScalarValue;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::sql::sqlparser::ast::Statement;
use futures::{Sink, SinkExt, Stream, StreamExt};
use pgwire::api::auth::cleartext::CleartextPasswordAuthStartupHandler;
use pgwire::api::auth::md5pass::{Md5PasswordAuthStartupHandler, hash_md5_password};
use pgwire::api::auth::{
    AuthDriver, AuthOutcome, AuthSource, DefaultServerParameterProvider, LoginInfo, Password,
    StartupHandler, finish_authentication, protocol_negotiation,
    save_startup_parameters_to_metadata,
};
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{DataRowEncoder, FieldFormat, FieldInfo, QueryResponse, Response, Tag};
use pgwire::api::stmt::QueryParser;
use pgwire::api::store::PortalStore;
use pgwire::api::{
    ClientInfo, ClientPortalStore, PgWireConnectionState, PgWireServerHandlers, Type,
};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::data::DataRow;
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use tokio::net::TcpListener;
use weft_query::sql::functions::{PG_VERSION, setting};
use weft_query::sql::{Prepared, Session, SqlError, SqlErrorKind, parse};
use weft_storage::model::TenantId;

use super::http::WHOLE_ANSWER_BYTES;
use crate::damage::answered_without_damage;
use crate::state::SharedState;

/// Accepts connections until `shutdown` resolves; each connection runs on its own task.
pub async fn serve(
    listener: TcpListener,
    tls: Option<pgwire::tokio::TlsAcceptor>,
    max_connections: usize,
    state: SharedState,
    password: Option<String>,
    shutdown: impl Future<Output = ()>,
) {
    let auth = state.auth.clone();
    let handlers = Arc::new(Handlers {
        backend: Arc::new(Backend {
            state: state.clone(),
            parser: Arc::new(Parser { state }),
        }),
        startup: Arc::new(Startup {
            require_tls: tls.is_some(),
            scram: auth
                .clone()
                .map(|a| (a, AuthDriver::new(server_parameters()))),
            tokens: auth.map(|a| {
                CleartextPasswordAuthStartupHandler::new(TokenSource(a), server_parameters())
            }),
            md5: password.map(|p| {
                Md5PasswordAuthStartupHandler::new(
                    Arc::new(Secret(p)),
                    Arc::new(server_parameters()),
                )
            }),
        }),
    });
    let connections = Arc::new(tokio::sync::Semaphore::new(max_connections));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((socket, _)) => {
                    let _ = socket.set_nodelay(true);
                    let Ok(open) = connections.clone().try_acquire_owned() else {
                        tokio::spawn(refuse(socket, max_connections));
                        continue;
                    };
                    let h = handlers.clone();
                    let tls = tls.clone();
                    tokio::spawn(async move {
                        let _open = open;
                        if let Err(e) = super::wire::serve_connection(socket, tls, h).await {
                            tracing::debug!(error = %e, "PostgreSQL connection ended with an error");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "PostgreSQL accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
        }
    }
}

/// Answers a connection over `--pg-max-connections` with PostgreSQL's own refusal (FATAL
/// 53300) before any start-up, and closes it.
async fn refuse(mut socket: tokio::net::TcpStream, max: usize) {
    use tokio::io::AsyncWriteExt;
    let message = format!(
        "sorry, too many clients already: {max} connections are open, the most --pg-max-connections allows"
    );
    let mut fields = Vec::new();
    for (tag, value) in [
        (b'S', "FATAL"),
        (b'V', "FATAL"),
        (b'C', "53300"),
        (b'M', &message),
    ] {
        fields.push(tag);
        fields.extend_from_slice(value.as_bytes());
        fields.push(0);
    }
    fields.push(0);
    let mut frame = vec![b'E'];
    frame.extend_from_slice(&((fields.len() + 4) as i32).to_be_bytes());
    frame.extend_from_slice(&fields);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), socket.write_all(&frame)).await;
    let _ = socket.shutdown().await;
}

fn server_parameters() -> DefaultServerParameterProvider {
    let mut p = DefaultServerParameterProvider::default();
    p.server_version = format!("{PG_VERSION} (Weft {})", env!("CARGO_PKG_VERSION"));
    p.is_superuser = false;
    p.default_transaction_read_only = true;
    p.time_zone = "UTC".into();
    p.date_style = "ISO, MDY".into();
    p
}

struct Handlers {
    backend: Arc<Backend>,
    startup: Arc<Startup>,
}

impl PgWireServerHandlers for Handlers {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        self.backend.clone()
    }
    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        self.backend.clone()
    }
    fn startup_handler(&self) -> Arc<impl StartupHandler> {
        self.startup.clone()
    }
}

// ---------------------------------------------------------------------------------------
// start-up: the database names the tenant; md5 when a password is configured

#[derive(Debug)]
struct Secret(String);

#[async_trait]
impl AuthSource for Secret {
    async fn get_password(&self, login: &LoginInfo) -> PgWireResult<Password> {
        let salt: [u8; 4] = rand::random();
        let hashed = hash_md5_password(login.user().unwrap_or_default(), &self.0, &salt);
        Ok(Password::new(Some(salt.to_vec()), hashed.into_bytes()))
    }
}

/// Tokens of the auth file as PostgreSQL passwords.
#[derive(Debug)]
struct TokenSource(Arc<crate::auth::Auth>);

#[async_trait]
impl AuthSource for TokenSource {
    async fn get_password(&self, _login: &LoginInfo) -> PgWireResult<Password> {
        // never asked: tokens are verified by `verify_password`, from their hashes
        Err(user_error(
            "FATAL",
            "28000",
            "tokens are verified, not read back".into(),
        ))
    }

    async fn verify_password(
        &self,
        login: &LoginInfo,
        presented: &[u8],
    ) -> PgWireResult<Option<()>> {
        let token = std::str::from_utf8(presented).unwrap_or("");
        let tenant =
            tenant_of_database(login.database()).map_err(|e| user_error("FATAL", "3D000", e))?;
        match self.0.authorize(
            Some(token),
            Some(tenant.as_str()),
            Some(crate::auth::Scope::Read),
        ) {
            Ok(_) => Ok(None),
            Err(crate::auth::Denied::Unauthenticated(_)) => Err(PgWireError::InvalidPassword(
                login.user().unwrap_or_default().to_owned(),
            )),
            Err(crate::auth::Denied::Forbidden(m)) => Err(user_error("FATAL", "42501", m)),
        }
    }
}

/// Connection metadata key: this connection signs in with SCRAM.
const SCRAM_MARK: &str = "weft.scram";

type TokenStartup =
    CleartextPasswordAuthStartupHandler<TokenSource, DefaultServerParameterProvider>;

struct Startup {
    /// TLS is configured: connections that did not negotiate it are refused.
    require_tls: bool,
    /// SCRAM-SHA-256 over the tokens, used when any token in force has a verifier.
    scram: Option<(
        Arc<crate::auth::Auth>,
        AuthDriver<DefaultServerParameterProvider>,
    )>,
    /// The token as a clear-text password, when no token has a SCRAM verifier.
    tokens: Option<TokenStartup>,
    md5: Option<Md5PasswordAuthStartupHandler<Secret, DefaultServerParameterProvider>>,
}

/// The tenant a database name stands for.
pub fn tenant_of_database(db: Option<&str>) -> Result<TenantId, String> {
    match db.map(str::trim) {
        None | Some("") | Some("weft") | Some("postgres") => Ok(TenantId::default_tenant()),
        Some(name) => TenantId::new(name)
            .map_err(|e| format!("database \"{name}\" is not a valid tenant name: {e}")),
    }
}

pub(crate) fn user_error(severity: &str, code: &str, message: String) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        severity.to_owned(),
        code.to_owned(),
        message,
    )))
}

#[async_trait]
impl StartupHandler for Startup {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if self.require_tls && !client.is_secure() {
            return Err(user_error(
                "FATAL",
                "28000",
                "this server takes TLS connections only: connect with sslmode=require (or verify-full)"
                    .into(),
            ));
        }
        if let PgWireFrontendMessage::Startup(startup) = &message
            && let Err(e) =
                tenant_of_database(startup.parameters.get("database").map(String::as_str))
        {
            return Err(user_error("FATAL", "3D000", e));
        }
        if let Some((auth, driver)) = &self.scram {
            // the method is chosen at start-up and kept for the connection's later messages
            let scram = match &message {
                PgWireFrontendMessage::Startup(_) => auth.has_scram(),
                _ => client.metadata().contains_key(SCRAM_MARK),
            };
            if scram {
                let outcome = match message {
                    PgWireFrontendMessage::Startup(ref startup) => {
                        protocol_negotiation(client, startup).await?;
                        save_startup_parameters_to_metadata(client, startup);
                        client.metadata_mut().insert(SCRAM_MARK.into(), "1".into());
                        let mechanism = Box::new(super::scram::TokenScram::new(auth.clone()));
                        driver.begin_authentication(client, mechanism).await?
                    }
                    PgWireFrontendMessage::PasswordMessageFamily(m) => {
                        driver.advance_authentication(client, m).await?
                    }
                    _ => return Ok(()),
                };
                if let AuthOutcome::Authenticated { final_message, .. } = outcome {
                    driver
                        .complete_authentication(client, final_message)
                        .await?;
                }
                return Ok(());
            }
        }
        if let Some(tokens) = &self.tokens {
            return tokens.on_startup(client, message).await;
        }
        if let Some(md5) = &self.md5 {
            return md5.on_startup(client, message).await;
        }
        if let PgWireFrontendMessage::Startup(startup) = &message {
            protocol_negotiation(client, startup).await?;
            save_startup_parameters_to_metadata(client, startup);
            finish_authentication(client, &server_parameters()).await?;
            client.set_state(PgWireConnectionState::ReadyForQuery);
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// statements

/// What a statement is, as far as the wire protocol cares.
#[derive(Clone, Debug)]
pub enum PgStatement {
    Query {
        statement: Box<Statement>,
        /// Parameter types inferred by the planner, by position.
        params: Vec<Option<DataType>>,
        schema: SchemaRef,
    },
    /// Accepted and answered with a tag, changing nothing.
    Command {
        tag: &'static str,
        transaction: Option<bool>,
    },
    /// `SHOW name` of a PostgreSQL setting.
    Show(String),
}

fn classify(statement: Statement) -> PgStatement {
    let text = statement.to_string();
    let first = text
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_ascii_uppercase();
    let command = |tag, transaction| PgStatement::Command { tag, transaction };
    match first.as_str() {
        "BEGIN" | "START" => return command("BEGIN", Some(true)),
        "COMMIT" | "END" => return command("COMMIT", Some(false)),
        "ROLLBACK" | "ABORT" => return command("ROLLBACK", Some(false)),
        "SET" => return command("SET", None),
        "RESET" => return command("RESET", None),
        "DISCARD" => return command("DISCARD ALL", None),
        "DEALLOCATE" => return command("DEALLOCATE", None),
        "CLOSE" => return command("CLOSE CURSOR", None),
        "UNLISTEN" => return command("UNLISTEN", None),
        _ => {}
    }
    if let Statement::ShowVariable { variable } = &statement {
        let name = variable
            .iter()
            .map(|i| i.value.clone())
            .collect::<Vec<_>>()
            .join(" ");
        let key = match name.to_ascii_lowercase().as_str() {
            "transaction isolation level" => "transaction_isolation".to_owned(),
            other => other.to_owned(),
        };
        if setting(&key).is_some() {
            return PgStatement::Show(key);
        }
    }
    PgStatement::Query {
        statement: Box::new(statement),
        params: Vec::new(),
        schema: Arc::new(arrow::datatypes::Schema::empty()),
    }
}

fn sql_error(e: SqlError) -> PgWireError {
    let code = match e.kind {
        SqlErrorKind::NotAQuery => "25006", // read_only_sql_transaction
        SqlErrorKind::Invalid if e.message.starts_with("syntax error") => "42601",
        SqlErrorKind::Invalid => "42P01",
        SqlErrorKind::ResourcesExhausted => "53200", // out_of_memory
        SqlErrorKind::Timeout => "57014",            // query_canceled
        SqlErrorKind::Execution => "22000",
        SqlErrorKind::Internal => "XX000",
        SqlErrorKind::Busy => "53300", // too_many_connections
    };
    let mut info = ErrorInfo::new("ERROR".to_owned(), code.to_owned(), e.message.clone());
    if let Some(l) = e.line
        && let Some(c) = e.column
    {
        info.detail = Some(format!("at line {l}, column {c}"));
    }
    PgWireError::UserError(Box::new(info))
}

/// A `sql_error` that also points into the statement text (psql draws the caret from it).
fn sql_error_in(e: SqlError, sql: &str) -> PgWireError {
    let at = match (e.line, e.column) {
        (Some(l), Some(c)) => position(sql, l, c),
        _ => None,
    };
    match sql_error(e) {
        PgWireError::UserError(mut info) => {
            info.position = at.map(|p| p.to_string());
            PgWireError::UserError(info)
        }
        other => other,
    }
}

/// The 1-based character position of (line, column) in a text.
fn position(sql: &str, line: u64, column: u64) -> Option<usize> {
    let mut chars = 0usize;
    for (i, l) in sql.split('\n').enumerate() {
        if i as u64 + 1 == line {
            return Some(chars + column as usize);
        }
        chars += l.chars().count() + 1;
    }
    None
}

fn tenant_of<C: ClientInfo>(client: &C) -> PgWireResult<TenantId> {
    tenant_of_database(client.metadata().get("database").map(String::as_str))
        .map_err(|e| user_error("ERROR", "3D000", e))
}

// ---------------------------------------------------------------------------------------
// types and encoding

/// The PostgreSQL type a result column is sent as.
pub fn pg_type(t: &DataType) -> Type {
    match t {
        DataType::Boolean => Type::BOOL,
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => Type::INT2,
        DataType::Int32 | DataType::UInt16 => Type::INT4,
        DataType::Int64 | DataType::UInt32 | DataType::UInt64 => Type::INT8,
        DataType::Float16 | DataType::Float32 => Type::FLOAT4,
        DataType::Float64 | DataType::Decimal128(_, _) | DataType::Decimal256(_, _) => Type::FLOAT8,
        DataType::Timestamp(_, Some(_)) => Type::TIMESTAMPTZ,
        DataType::Timestamp(_, None) => Type::TIMESTAMP,
        DataType::Date32 | DataType::Date64 => Type::DATE,
        DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView
        | DataType::FixedSizeBinary(_) => Type::BYTEA,
        DataType::List(f) | DataType::LargeList(f) => match f.data_type() {
            DataType::Int64 | DataType::Int32 | DataType::Int16 | DataType::Int8 => {
                Type::INT8_ARRAY
            }
            DataType::Float64 | DataType::Float32 => Type::FLOAT8_ARRAY,
            DataType::Boolean => Type::BOOL_ARRAY,
            _ => Type::TEXT_ARRAY,
        },
        DataType::Dictionary(_, v) => pg_type(v),
        _ => Type::TEXT,
    }
}

fn fields(schema: &SchemaRef, format: Option<&Format>) -> Vec<FieldInfo> {
    schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let format = format.map_or(FieldFormat::Text, |fmt| fmt.format_for(i));
            FieldInfo::new(f.name().clone(), None, None, pg_type(f.data_type()), format)
        })
        .collect()
}

fn encode_err(e: impl std::fmt::Display) -> PgWireError {
    user_error(
        "ERROR",
        "XX000",
        format!("cannot encode a result value: {e}"),
    )
}

/// Arrow columns as the arrays the encoder reads, normalised to a few shapes.
fn normalise(c: &ArrayRef) -> PgWireResult<ArrayRef> {
    let target = match c.data_type() {
        DataType::Int8 | DataType::UInt8 => Some(DataType::Int16),
        DataType::UInt16 => Some(DataType::Int32),
        DataType::UInt32 | DataType::UInt64 => Some(DataType::Int64),
        DataType::Float16 => Some(DataType::Float32),
        DataType::Decimal128(_, _) | DataType::Decimal256(_, _) => Some(DataType::Float64),
        DataType::Timestamp(u, tz) if *u != TimeUnit::Nanosecond => {
            Some(DataType::Timestamp(TimeUnit::Nanosecond, tz.clone()))
        }
        DataType::Date64 => Some(DataType::Date32),
        DataType::LargeUtf8 | DataType::Utf8View | DataType::Dictionary(_, _) => {
            Some(DataType::Utf8)
        }
        DataType::LargeBinary | DataType::BinaryView | DataType::FixedSizeBinary(_) => {
            Some(DataType::Binary)
        }
        DataType::LargeList(f) => Some(DataType::List(f.clone())),
        _ => None,
    };
    match target {
        Some(t) => arrow::compute::cast(c, &t).map_err(encode_err),
        None => Ok(c.clone()),
    }
}

fn text_of(c: &ArrayRef, row: usize) -> String {
    match c.data_type() {
        // JSON text, as the HTTP API gives it
        DataType::Map(_, _) | DataType::Struct(_) => crate::sql::encode::json_text(c, row),
        _ => arrow::util::display::ArrayFormatter::try_new(
            c.as_ref(),
            &arrow::util::display::FormatOptions::default(),
        )
        .map(|f| f.value(row).to_string())
        .unwrap_or_default(),
    }
}

fn encode_value(enc: &mut DataRowEncoder, c: &ArrayRef, row: usize) -> PgWireResult<()> {
    use arrow::datatypes::*;
    if c.is_null(row) {
        return match c.data_type() {
            DataType::Boolean => enc.encode_field(&None::<bool>),
            DataType::Int16 => enc.encode_field(&None::<i16>),
            DataType::Int32 => enc.encode_field(&None::<i32>),
            DataType::Int64 => enc.encode_field(&None::<i64>),
            DataType::Float32 => enc.encode_field(&None::<f32>),
            DataType::Float64 => enc.encode_field(&None::<f64>),
            DataType::Timestamp(_, Some(_)) => enc.encode_field(&None::<DateTime<Utc>>),
            DataType::Timestamp(_, None) => enc.encode_field(&None::<chrono::NaiveDateTime>),
            DataType::Date32 => enc.encode_field(&None::<NaiveDate>),
            DataType::Binary => enc.encode_field(&None::<Vec<u8>>),
            DataType::List(_) => enc.encode_field(&None::<Vec<Option<String>>>),
            _ => enc.encode_field(&None::<String>),
        };
    }
    match c.data_type() {
        DataType::Boolean => enc.encode_field(&c.as_boolean().value(row)),
        DataType::Int16 => enc.encode_field(&c.as_primitive::<Int16Type>().value(row)),
        DataType::Int32 => enc.encode_field(&c.as_primitive::<Int32Type>().value(row)),
        DataType::Int64 => enc.encode_field(&c.as_primitive::<Int64Type>().value(row)),
        DataType::Float32 => enc.encode_field(&c.as_primitive::<Float32Type>().value(row)),
        DataType::Float64 => enc.encode_field(&c.as_primitive::<Float64Type>().value(row)),
        DataType::Utf8 => enc.encode_field(&c.as_string::<i32>().value(row)),
        DataType::Binary => enc.encode_field(&c.as_binary::<i32>().value(row)),
        DataType::Timestamp(_, tz) => {
            let n = c.as_primitive::<TimestampNanosecondType>().value(row);
            let t = DateTime::from_timestamp(
                n.div_euclid(1_000_000_000),
                n.rem_euclid(1_000_000_000) as u32,
            )
            .ok_or_else(|| encode_err(format!("timestamp {n} out of range")))?;
            if tz.is_some() {
                enc.encode_field(&t)
            } else {
                enc.encode_field(&t.naive_utc())
            }
        }
        DataType::Date32 => {
            let days = c.as_primitive::<Date32Type>().value(row);
            let d = NaiveDate::from_ymd_opt(1970, 1, 1)
                .and_then(|e| e.checked_add_signed(chrono::Duration::days(i64::from(days))))
                .ok_or_else(|| encode_err(format!("date {days} out of range")))?;
            enc.encode_field(&d)
        }
        DataType::List(f) => {
            let items = c.as_list::<i32>().value(row);
            match f.data_type() {
                DataType::Int64 | DataType::Int32 | DataType::Int16 | DataType::Int8 => {
                    let ints =
                        arrow::compute::cast(&items, &DataType::Int64).map_err(encode_err)?;
                    let v: Vec<Option<i64>> = ints.as_primitive::<Int64Type>().iter().collect();
                    enc.encode_field(&v)
                }
                DataType::Float64 | DataType::Float32 => {
                    let fl =
                        arrow::compute::cast(&items, &DataType::Float64).map_err(encode_err)?;
                    let v: Vec<Option<f64>> = fl.as_primitive::<Float64Type>().iter().collect();
                    enc.encode_field(&v)
                }
                DataType::Boolean => {
                    let v: Vec<Option<bool>> = items.as_boolean().iter().collect();
                    enc.encode_field(&v)
                }
                _ => {
                    let v: Vec<Option<String>> = (0..items.len())
                        .map(|i| (!items.is_null(i)).then(|| text_of(&items, i)))
                        .collect();
                    enc.encode_field(&v)
                }
            }
        }
        _ => enc.encode_field(&text_of(c, row)),
    }
}

fn encode_batch(batch: &RecordBatch, fields: &Arc<Vec<FieldInfo>>) -> PgWireResult<Vec<DataRow>> {
    let columns = batch
        .columns()
        .iter()
        .map(normalise)
        .collect::<PgWireResult<Vec<_>>>()?;
    let mut enc = DataRowEncoder::new(fields.clone());
    let mut rows = Vec::with_capacity(batch.num_rows());
    for row in 0..batch.num_rows() {
        for c in &columns {
            encode_value(&mut enc, c, row)?;
        }
        rows.push(enc.take_row());
    }
    Ok(rows)
}

/// Rows of a running query, under its deadline.
fn row_stream(
    stream: SendableRecordBatchStream,
    fields: Arc<Vec<FieldInfo>>,
    deadline: tokio::time::Instant,
    limit: std::time::Duration,
) -> impl Stream<Item = PgWireResult<DataRow>> + Send + 'static {
    futures::stream::unfold(Some(stream), move |stream| {
        let fields = fields.clone();
        async move {
            let mut stream = stream?;
            let item = match tokio::time::timeout_at(deadline, stream.next()).await {
                Ok(Some(Ok(batch))) => encode_batch(&batch, &fields),
                Ok(Some(Err(e))) => Err(sql_error(SqlError::from_datafusion(e, false))),
                Ok(None) => return None,
                Err(_) => Err(sql_error(SqlError::timeout(limit))),
            };
            let next = item.is_ok().then_some(stream);
            let rows: Vec<PgWireResult<DataRow>> = match item {
                Ok(rows) => rows.into_iter().map(Ok).collect(),
                Err(e) => vec![Err(e)],
            };
            Some((futures::stream::iter(rows), next))
        }
    })
    .flatten()
}

// ---------------------------------------------------------------------------------------
// the handlers

struct Backend {
    state: SharedState,
    parser: Arc<Parser>,
}

struct Parser {
    state: SharedState,
}

impl Backend {
    async fn run(
        &self,
        tenant: &TenantId,
        statement: PgStatement,
        params: Vec<ScalarValue>,
        format: Option<&Format>,
        text: Option<&str>,
    ) -> PgWireResult<Response> {
        match statement {
            PgStatement::Command { tag, transaction } => Ok(match transaction {
                Some(true) => Response::TransactionStart(Tag::new(tag)),
                Some(false) => Response::TransactionEnd(Tag::new(tag)),
                None => Response::Execution(Tag::new(tag)),
            }),
            PgStatement::Show(name) => {
                let schema = Arc::new(arrow::datatypes::Schema::new(vec![
                    arrow::datatypes::Field::new(&name, DataType::Utf8, false),
                ]));
                let fields = Arc::new(fields(&schema, format));
                let mut enc = DataRowEncoder::new(fields.clone());
                enc.encode_field(&setting(&name).unwrap_or_default())?;
                let row = enc.take_row();
                Ok(Response::Query(QueryResponse::new(
                    fields,
                    futures::stream::iter(vec![Ok(row)]),
                )))
            }
            PgStatement::Query { statement, .. } => {
                let store = &self.state.store;
                answered_without_damage(store, tenant, Result::is_err, || {
                    self.query(tenant, statement.clone(), params.clone(), format, text)
                })
                .await
            }
        }
    }

    /// Sends a warning notice for each damaged block the tenant's answers leave out.
    async fn warn_of_damage<C>(&self, client: &mut C, tenant: &TenantId) -> PgWireResult<()>
    where
        C: Sink<PgWireBackendMessage> + Unpin + Send,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        for w in crate::damage::warnings_for(&self.state, tenant) {
            let notice = ErrorInfo::new("WARNING".into(), "01000".into(), w);
            client
                .send(PgWireBackendMessage::NoticeResponse(notice.into()))
                .await?;
        }
        Ok(())
    }

    async fn query(
        &self,
        tenant: &TenantId,
        statement: Box<Statement>,
        params: Vec<ScalarValue>,
        format: Option<&Format>,
        text: Option<&str>,
    ) -> PgWireResult<Response> {
        let started = std::time::Instant::now();
        let session = self.state.sql.session(tenant).map_err(sql_error)?;
        let plan = if params.is_empty() {
            // the statement's text is the key of its kept plan
            let text = text.map_or_else(|| statement.to_string(), str::to_owned);
            session
                .prepare(&text, || Ok(*statement))
                .await
                .map_err(sql_error)?
        } else {
            let plan = session.plan(*statement).await.map_err(sql_error)?;
            let plan = plan
                .with_param_values(params)
                .map_err(|e| sql_error(SqlError::from_datafusion(e, true)))?;
            session.optimise(&plan).map_err(sql_error)?.into()
        };
        self.respond(session, plan, format, started).await
    }

    /// Starts an optimised plan and answers with its rows. The first rows (up to
    /// [`WHOLE_ANSWER_BYTES`]) are gathered before the answer starts, as the HTTP endpoint
    /// does: most answers are whole before the row description goes out, and an error in
    /// them is an error of the statement rather than a row stream cut short.
    async fn respond(
        &self,
        session: Session,
        plan: Prepared,
        format: Option<&Format>,
        started: std::time::Instant,
    ) -> PgWireResult<Response> {
        let limit = self.state.sql.config().timeout;
        let deadline = tokio::time::Instant::now() + limit;
        let query = tokio::time::timeout_at(deadline, session.execute_optimised(plan))
            .await
            .map_err(|_| sql_error(SqlError::timeout(limit)))?
            .map_err(sql_error)?;
        let fields = Arc::new(fields(&query.schema, format));
        let mut stream = query.stream;
        let mut first: Vec<PgWireResult<DataRow>> = Vec::new();
        let mut held = 0;
        let mut ended = false;
        while held <= WHOLE_ANSWER_BYTES {
            match tokio::time::timeout_at(deadline, stream.next()).await {
                Ok(Some(Ok(batch))) => {
                    held += batch.get_array_memory_size();
                    first.extend(encode_batch(&batch, &fields)?.into_iter().map(Ok));
                }
                Ok(Some(Err(e))) => return Err(sql_error(SqlError::from_datafusion(e, false))),
                Ok(None) => {
                    ended = true;
                    break;
                }
                Err(_) => return Err(sql_error(SqlError::timeout(limit))),
            }
        }
        self.state
            .requests
            .observe("pgwire query", started.elapsed());
        let first = futures::stream::iter(first);
        Ok(Response::Query(if ended {
            QueryResponse::new(fields, first.boxed())
        } else {
            let rest = row_stream(stream, fields.clone(), deadline, limit);
            QueryResponse::new(fields, first.chain(rest).boxed())
        }))
    }

    /// The answer of a simple query whose text was planned before, without parsing it again.
    async fn kept(&self, tenant: &TenantId, query: &str) -> PgWireResult<Option<Response>> {
        let started = std::time::Instant::now();
        let engine = &self.state.sql;
        if !engine
            .plans()
            .holds(tenant, engine.config().pushdown, query)
        {
            return Ok(None);
        }
        let session = engine.session(tenant).map_err(sql_error)?;
        match session.kept(query).await.map_err(sql_error)? {
            Some(plan) => Ok(Some(self.respond(session, plan, None, started).await?)),
            None => Ok(None),
        }
    }
}

#[async_trait]
impl SimpleQueryHandler for Backend {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let tenant = tenant_of(client)?;
        let store = &self.state.store;
        let kept =
            answered_without_damage(store, &tenant, Result::is_err, || self.kept(&tenant, query))
                .await;
        if kept.as_ref().is_ok_and(Option::is_some) {
            self.warn_of_damage(client, &tenant).await?;
        }
        match kept {
            Ok(Some(response)) => return Ok(vec![response]),
            Ok(None) => {}
            Err(PgWireError::UserError(info)) => return Ok(vec![Response::Error(info)]),
            Err(e) => return Err(e),
        }
        let statements = parse(query).map_err(|e| sql_error_in(e, query))?;
        // a single statement's plan is kept under the text as sent
        let text = (statements.len() == 1).then_some(query);
        let mut out = Vec::with_capacity(statements.len());
        for s in statements {
            match self.run(&tenant, classify(s), Vec::new(), None, text).await {
                Ok(r) => out.push(r),
                Err(PgWireError::UserError(info)) => {
                    out.push(Response::Error(info));
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        if out.is_empty() {
            out.push(Response::EmptyQuery);
        }
        self.warn_of_damage(client, &tenant).await?;
        Ok(out)
    }
}

#[async_trait]
impl QueryParser for Parser {
    type Statement = PgStatement;

    async fn parse_sql<C>(
        &self,
        client: &C,
        sql: &str,
        _types: &[Option<Type>],
    ) -> PgWireResult<Option<PgStatement>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let tenant = tenant_of(client)?;
        let mut statements = parse(sql).map_err(|e| sql_error_in(e, sql))?;
        if statements.is_empty() {
            return Ok(None);
        }
        if statements.len() > 1 {
            return Err(user_error(
                "ERROR",
                "42601",
                "cannot insert multiple commands into a prepared statement".into(),
            ));
        }
        match classify(statements.remove(0)) {
            PgStatement::Query { statement, .. } => {
                let session = self.state.sql.session(&tenant).map_err(sql_error)?;
                let plan = session
                    .plan((*statement).clone())
                    .await
                    .map_err(|e| sql_error_in(e, sql))?;
                let types = plan
                    .get_parameter_types()
                    .map_err(|e| sql_error(SqlError::from_datafusion(e, true)))?;
                let mut params: Vec<(usize, Option<DataType>)> = types
                    .into_iter()
                    .filter_map(|(k, t)| {
                        k.trim_start_matches('$')
                            .parse::<usize>()
                            .ok()
                            .map(|i| (i, t))
                    })
                    .collect();
                params.sort_by_key(|(i, _)| *i);
                let n = params.last().map_or(0, |(i, _)| *i);
                if n > MAX_PARAMETERS {
                    return Err(too_many_parameters(n));
                }
                let mut by_index = vec![None; n];
                for (i, t) in params {
                    if i >= 1 {
                        by_index[i - 1] = t;
                    }
                }
                Ok(Some(PgStatement::Query {
                    statement,
                    params: by_index,
                    schema: Arc::new(plan.schema().as_arrow().clone()),
                }))
            }
            other => Ok(Some(other)),
        }
    }

    fn get_parameter_types(&self, stmt: &PgStatement) -> PgWireResult<Vec<Type>> {
        Ok(match stmt {
            PgStatement::Query { params, .. } => params
                .iter()
                .map(|t| t.as_ref().map_or(Type::UNKNOWN, pg_type))
                .collect(),
            _ => Vec::new(),
        })
    }

    fn get_result_schema(
        &self,
        stmt: &PgStatement,
        format: Option<&Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        Ok(match stmt {
            PgStatement::Query { schema, .. } => fields(schema, format),
            PgStatement::Show(name) => fields(
                &Arc::new(arrow::datatypes::Schema::new(vec![
                    arrow::datatypes::Field::new(name, DataType::Utf8, false),
                ])),
                format,
            ),
            PgStatement::Command { .. } => Vec::new(),
        })
    }
}

/// PostgreSQL's own limit on a statement's parameters (a Bind carries their count as an int16):
/// the statement's parameter slots are allocated up to the highest placeholder number, so a
/// `$1000000000` must be refused before that allocation.
const MAX_PARAMETERS: usize = 65_535;

fn too_many_parameters(highest: usize) -> PgWireError {
    user_error(
        "ERROR",
        "54000",
        format!(
            "statement uses parameter ${highest}; at most {MAX_PARAMETERS} parameters are allowed"
        ),
    )
}

/// A bound parameter as a DataFusion value of the type the planner wants.
fn parameter(
    portal: &Portal<PgStatement>,
    i: usize,
    want: Option<&DataType>,
) -> PgWireResult<ScalarValue> {
    let declared = portal.statement.parameter_types.get(i).cloned().flatten();
    let ty = declared.unwrap_or_else(|| want.map_or(Type::TEXT, pg_type));
    let bad = |e: PgWireError| user_error("ERROR", "22P02", format!("parameter ${}: {e}", i + 1));
    let v = match ty {
        Type::BOOL => ScalarValue::Boolean(portal.parameter::<bool>(i, &ty).map_err(bad)?),
        Type::INT2 => {
            ScalarValue::Int64(portal.parameter::<i16>(i, &ty).map_err(bad)?.map(i64::from))
        }
        Type::INT4 => {
            ScalarValue::Int64(portal.parameter::<i32>(i, &ty).map_err(bad)?.map(i64::from))
        }
        Type::INT8 => ScalarValue::Int64(portal.parameter::<i64>(i, &ty).map_err(bad)?),
        Type::FLOAT4 => {
            ScalarValue::Float64(portal.parameter::<f32>(i, &ty).map_err(bad)?.map(f64::from))
        }
        Type::FLOAT8 => ScalarValue::Float64(portal.parameter::<f64>(i, &ty).map_err(bad)?),
        Type::TIMESTAMPTZ => ScalarValue::TimestampNanosecond(
            portal
                .parameter::<DateTime<chrono::FixedOffset>>(i, &ty)
                .map_err(bad)?
                .and_then(|t| t.timestamp_nanos_opt()),
            Some("UTC".into()),
        ),
        Type::TIMESTAMP => ScalarValue::TimestampNanosecond(
            portal
                .parameter::<chrono::NaiveDateTime>(i, &ty)
                .map_err(bad)?
                .and_then(|t| t.and_utc().timestamp_nanos_opt()),
            None,
        ),
        _ => {
            let text_like = matches!(
                ty,
                Type::TEXT | Type::VARCHAR | Type::NAME | Type::BPCHAR | Type::UNKNOWN
            );
            match portal.parameters.get(i).cloned().flatten() {
                None => ScalarValue::Utf8(None),
                Some(_) if portal.parameter_format.is_binary(i) && !text_like => {
                    return Err(user_error(
                        "ERROR",
                        "22P02",
                        format!(
                            "parameter ${}: binary values of type {} are not supported; send it as text",
                            i + 1,
                            ty.name()
                        ),
                    ));
                }
                Some(bytes) => {
                    ScalarValue::Utf8(Some(String::from_utf8(bytes.to_vec()).map_err(|_| {
                        user_error(
                            "ERROR",
                            "22021",
                            format!("parameter ${} is not valid UTF-8", i + 1),
                        )
                    })?))
                }
            }
        }
    };
    match want {
        Some(t) if v.data_type() != *t && !v.is_null() => v
            .cast_to(t)
            .map_err(|e| user_error("ERROR", "22P02", format!("parameter ${}: {e}", i + 1))),
        Some(t) if v.is_null() => ScalarValue::try_from(t).or(Ok(v)),
        _ => Ok(v),
    }
}

#[async_trait]
impl ExtendedQueryHandler for Backend {
    type Statement = PgStatement;
    type QueryParser = Parser;

    fn query_parser(&self) -> Arc<Parser> {
        self.parser.clone()
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<PgStatement>,
        _max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let tenant = tenant_of(client)?;
        let statement = portal.statement.statement.clone();
        let params = match &statement {
            PgStatement::Query { params, .. } => (0..portal.parameter_len())
                .map(|i| parameter(portal, i, params.get(i).and_then(Option::as_ref)))
                .collect::<PgWireResult<Vec<_>>>()?,
            _ => Vec::new(),
        };
        let answer = self
            .run(
                &tenant,
                statement,
                params,
                Some(&portal.result_column_format),
                None,
            )
            .await;
        if answer.is_ok() {
            self.warn_of_damage(client, &tenant).await?;
        }
        answer
    }
}
