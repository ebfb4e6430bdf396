//! The NVML source: `libnvidia-ml` is loaded when the collector starts (`Nvml::init`), so a
//! build needs no GPU and a host without the driver only turns the collector off. XID errors
//! arrive on a thread of their own waiting on an NVML event set.

use std::sync::mpsc;

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, PcieUtilCounter, TemperatureSensor,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;

use super::{GpuError, GpuSample, Gpus, XidEvent};

pub struct NvmlGpus {
    nvml: Nvml,
    events: mpsc::Receiver<XidEvent>,
}

fn unavailable(e: NvmlError) -> GpuError {
    match e {
        NvmlError::LibloadingError(_)
        | NvmlError::DriverNotLoaded
        | NvmlError::LibraryNotFound
        | NvmlError::NoPermission => GpuError::Unavailable(e.to_string()),
        other => GpuError::Nvml(other.to_string()),
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

impl NvmlGpus {
    /// Loads NVML; `GpuError::Unavailable` when the library or driver is missing.
    pub fn open() -> Result<Self, GpuError> {
        let nvml = Nvml::init().map_err(unavailable)?;
        let (tx, rx) = mpsc::channel();
        // XID errors: a thread with its own handle waits on an event set of every GPU (an
        // event set borrows its handle, so it lives where the handle does)
        std::thread::Builder::new()
            .name("nvml-events".into())
            .spawn(move || {
                let Ok(nvml) = Nvml::init() else { return };
                let Ok(count) = nvml.device_count() else {
                    return;
                };
                let Ok(mut set) = nvml.create_event_set() else {
                    return;
                };
                let mut uuids = Vec::new();
                for i in 0..count {
                    let Ok(device) = nvml.device_by_index(i) else {
                        continue;
                    };
                    uuids.push(device.uuid().unwrap_or_default());
                    match device.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                        Ok(s) => set = s,
                        // XID events are not supported here: sampling goes on without them
                        Err(_) => return,
                    }
                }
                loop {
                    match set.wait(1000) {
                        Ok(event) => {
                            let uuid = event.device.uuid().unwrap_or_default();
                            let index = uuids.iter().position(|u| *u == uuid).unwrap_or(0) as u32;
                            let xid = match event.event_data {
                                Some(XidError::Value(v)) => v,
                                _ => 0,
                            };
                            let e = XidEvent {
                                index,
                                uuid,
                                xid,
                                time: now_ns(),
                            };
                            if tx.send(e).is_err() {
                                return;
                            }
                        }
                        Err(NvmlError::Timeout) => continue,
                        Err(_) => return,
                    }
                }
            })
            .map_err(|e| GpuError::Nvml(e.to_string()))?;
        Ok(Self { nvml, events: rx })
    }
}

fn process_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

impl Gpus for NvmlGpus {
    fn sample(&mut self) -> Result<Vec<GpuSample>, GpuError> {
        let count = self.nvml.device_count().map_err(unavailable)?;
        let mut out = Vec::with_capacity(count as usize);
        for index in 0..count {
            let d = self.nvml.device_by_index(index).map_err(unavailable)?;
            let utilization = d.utilization_rates().ok();
            let memory = d.memory_info().ok();
            let mut processes: Vec<(u32, String, u64)> = d
                .running_compute_processes()
                .unwrap_or_default()
                .into_iter()
                .map(|p| {
                    let bytes = match p.used_gpu_memory {
                        UsedGpuMemory::Used(b) => b,
                        UsedGpuMemory::Unavailable => 0,
                    };
                    (p.pid, process_name(p.pid), bytes)
                })
                .collect();
            processes.sort();
            out.push(GpuSample {
                index,
                uuid: d.uuid().unwrap_or_default(),
                name: d.name().unwrap_or_default(),
                sm_utilization: utilization.as_ref().map(|u| f64::from(u.gpu)),
                memory_utilization: utilization.as_ref().map(|u| f64::from(u.memory)),
                memory_used: memory.as_ref().map(|m| m.used),
                memory_free: memory.as_ref().map(|m| m.free),
                memory_total: memory.as_ref().map(|m| m.total),
                temperature: d.temperature(TemperatureSensor::Gpu).ok().map(f64::from),
                power_usage: d.power_usage().ok().map(f64::from),
                power_limit: d.enforced_power_limit().ok().map(f64::from),
                sm_clock: d.clock_info(Clock::SM).ok().map(f64::from),
                memory_clock: d.clock_info(Clock::Memory).ok().map(f64::from),
                pcie_tx: d.pcie_throughput(PcieUtilCounter::Send).ok().map(f64::from),
                pcie_rx: d
                    .pcie_throughput(PcieUtilCounter::Receive)
                    .ok()
                    .map(f64::from),
                ecc_corrected: d
                    .total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
                    .ok(),
                ecc_uncorrected: d
                    .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                    .ok(),
                throttle_reasons: d.current_throttle_reasons().ok().map(|r| r.bits()),
                processes,
            });
        }
        Ok(out)
    }

    fn events(&mut self) -> Vec<XidEvent> {
        self.events.try_iter().collect()
    }
}
