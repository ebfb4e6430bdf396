//! Running the GPU collector ([`weft_ingest::gpu`]): inside the server (`weft serve --gpu`,
//! points go straight to the ingester under the default tenant) or as an agent on a GPU host
//! (`weft gpu-agent --target URL`, points go over OTLP/HTTP to a Weft server). Each sample of
//! every GPU is one metrics request; XID events become log records.

use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use weft_ingest::gpu::{Gpus, events_request, metrics_request};
use weft_storage::model::TenantId;

use crate::state::SharedState;

/// Samples every `every` and stores the points (and XID records) through the ingester, until
/// `stop` turns true.
pub async fn run_local(
    state: SharedState,
    gpus: Box<dyn Gpus>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let host = weft_ingest::gpu::host_name();
    let gpus = Arc::new(std::sync::Mutex::new(gpus));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        if let Err(e) = collect_local(&state, &gpus, &host).await {
            tracing::warn!(error = %e, "GPU sample not stored; sampling goes on");
        }
    }
}

/// One sample of every GPU into the store.
pub async fn collect_local(
    state: &SharedState,
    gpus: &Arc<std::sync::Mutex<Box<dyn Gpus>>>,
    host: &str,
) -> anyhow::Result<usize> {
    let source = gpus.clone();
    let (samples, events) = tokio::task::spawn_blocking(move || {
        let mut g = source.lock().unwrap_or_else(|e| e.into_inner());
        (g.sample(), g.events())
    })
    .await?;
    let samples = samples?;
    let tenant = TenantId::default_tenant();
    let req = metrics_request(&samples, host, crate::time::now());
    let len = req.encoded_len();
    let stored = state
        .ingester
        .export_metrics(tenant.clone(), req, len)
        .await?;
    if !events.is_empty() {
        let logs = events_request(&events, host);
        let len = logs.encoded_len();
        state.ingester.export_logs(tenant, logs, len).await?;
    }
    Ok(stored.accepted)
}

/// `weft gpu-agent`: samples every `every` and sends OTLP/HTTP (protobuf) to `target`
/// (`http://host:4318`), under `tenant` when given. Fails at once when NVML is unavailable.
pub async fn agent(
    mut gpus: Box<dyn Gpus>,
    target: &str,
    tenant: Option<&str>,
    every: Duration,
    samples: Option<u64>,
) -> anyhow::Result<()> {
    let host = weft_ingest::gpu::host_name();
    let mut tick = tokio::time::interval(every);
    let mut taken = 0u64;
    loop {
        tick.tick().await;
        let batch = gpus.sample()?;
        let body = metrics_request(&batch, &host, crate::time::now()).encode_to_vec();
        if let Err(e) = post(target, "/v1/metrics", tenant, &body).await {
            tracing::warn!(error = %e, target, "GPU sample not sent; sampling goes on");
        }
        let events = gpus.events();
        if !events.is_empty() {
            let body = events_request(&events, &host).encode_to_vec();
            if let Err(e) = post(target, "/v1/logs", tenant, &body).await {
                tracing::warn!(error = %e, target, "XID events not sent");
            }
        }
        taken += 1;
        if samples.is_some_and(|n| taken >= n) {
            return Ok(());
        }
    }
}

/// POSTs a protobuf body over plain HTTP/1.1 and checks for a 200.
async fn post(target: &str, path: &str, tenant: Option<&str>, body: &[u8]) -> anyhow::Result<()> {
    let addr = target
        .strip_prefix("http://")
        .ok_or_else(|| anyhow::anyhow!("--target {target:?} must start with http://"))?
        .trim_end_matches('/');
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let tenant = tenant.map_or(String::new(), |t| format!("X-Scope-OrgID: {t}\r\n"));
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-protobuf\r\nContent-Length: {}\r\n{tenant}Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).await?;
    let status = String::from_utf8_lossy(&reply[..reply.len().min(64)]).into_owned();
    anyhow::ensure!(
        status.starts_with("HTTP/1.1 200"),
        "{path}: {}",
        status.lines().next().unwrap_or("no answer")
    );
    Ok(())
}

#[cfg(test)]
mod tests;
