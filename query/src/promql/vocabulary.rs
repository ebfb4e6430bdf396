//! One GPU and serving vocabulary: canonical metrics that every exporter's series answer to, so
//! that a query does not care whether DCGM, OpenTelemetry's `hw.gpu.*`, Weft's NVML collector
//! or a serving engine produced a series. A canonical name shows its sources' series converted
//! to its unit, with their labels renamed to the canonical ones (`gpu` → `gpu.id`, `Hostname`
//! → `host.name`, …); each source stays queryable under its own name.

/// A canonical metric and where its series come from.
pub struct Canonical {
    /// The OTLP-style name (shown translated: `gpu.utilization`, unit `1` →
    /// `gpu_utilization_ratio`).
    pub name: &'static str,
    pub unit: &'static str,
    /// (source metric name, factor to the canonical unit).
    pub sources: &'static [(&'static str, f64)],
}

const MIB: f64 = 1024.0 * 1024.0;

/// The canonical set (the README lists it).
pub const CANONICAL: &[Canonical] = &[
    Canonical {
        name: "gpu.utilization",
        unit: "1",
        sources: &[
            ("DCGM_FI_DEV_GPU_UTIL", 0.01),
            ("hw.gpu.utilization", 1.0),
            ("nvml.gpu.utilization", 0.01),
        ],
    },
    Canonical {
        name: "gpu.memory.used",
        unit: "By",
        sources: &[
            ("DCGM_FI_DEV_FB_USED", MIB),
            ("hw.gpu.memory.usage", 1.0),
            ("nvml.memory.used", 1.0),
        ],
    },
    Canonical {
        name: "gpu.memory.free",
        unit: "By",
        sources: &[("DCGM_FI_DEV_FB_FREE", MIB), ("nvml.memory.free", 1.0)],
    },
    Canonical {
        name: "gpu.memory.total",
        unit: "By",
        sources: &[("hw.gpu.memory.limit", 1.0), ("nvml.memory.total", 1.0)],
    },
    Canonical {
        name: "gpu.temperature",
        unit: "Cel",
        sources: &[("DCGM_FI_DEV_GPU_TEMP", 1.0), ("nvml.temperature", 1.0)],
    },
    Canonical {
        name: "gpu.power.usage",
        unit: "W",
        sources: &[
            ("DCGM_FI_DEV_POWER_USAGE", 1.0),
            ("hw.gpu.power", 1.0),
            ("nvml.power.usage", 0.001),
        ],
    },
    Canonical {
        name: "gpu.clock.sm",
        unit: "Hz",
        sources: &[("DCGM_FI_DEV_SM_CLOCK", 1e6), ("nvml.clock.sm", 1e6)],
    },
    Canonical {
        name: "gpu.clock.memory",
        unit: "Hz",
        sources: &[("DCGM_FI_DEV_MEM_CLOCK", 1e6), ("nvml.clock.memory", 1e6)],
    },
    Canonical {
        name: "gpu.tensor.active",
        unit: "1",
        sources: &[("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1.0)],
    },
    Canonical {
        name: "gpu.xid_errors",
        unit: "",
        sources: &[("DCGM_FI_DEV_XID_ERRORS", 1.0), ("nvml.xid_errors", 1.0)],
    },
    Canonical {
        name: "llm.kv_cache.usage",
        unit: "1",
        sources: &[
            ("vllm:kv_cache_usage_perc", 1.0),
            ("sglang:token_usage", 1.0),
            ("trtllm_kv_cache_utilization", 1.0),
            ("llm.kv_cache.usage", 1.0),
        ],
    },
    Canonical {
        name: "llm.requests.waiting",
        unit: "",
        sources: &[
            ("vllm:num_requests_waiting", 1.0),
            ("sglang:num_queue_reqs", 1.0),
            ("trtllm_num_requests_waiting", 1.0),
            ("tgi_queue_size", 1.0),
        ],
    },
    Canonical {
        name: "llm.requests.running",
        unit: "",
        sources: &[
            ("vllm:num_requests_running", 1.0),
            ("sglang:num_running_reqs", 1.0),
            ("trtllm_num_requests_running", 1.0),
            ("tgi_batch_current_size", 1.0),
        ],
    },
];

/// Source label keys and the canonical keys they become.
pub const LABELS: &[(&str, &str)] = &[
    ("gpu", "gpu.id"),
    ("UUID", "gpu.uuid"),
    ("modelName", "gpu.model"),
    ("Hostname", "host.name"),
    ("pci_bus_id", "gpu.pci_bus_id"),
    ("model_name", "gen_ai.request.model"),
    ("pod", "k8s.pod.name"),
    ("namespace", "k8s.namespace.name"),
    ("container", "k8s.container.name"),
];

/// The canonical key of a source label key.
pub fn canonical_label(key: &str) -> &str {
    LABELS
        .iter()
        .find(|(from, _)| *from == key)
        .map_or(key, |(_, to)| to)
}
