//! The build, and the process's own numbers read from /proc.

use std::sync::LazyLock;
use std::time::Instant;

use prometheus::{Gauge, IntGauge};

/// The commit the binary was built from (build.rs; `unknown` outside git).
pub const GIT_COMMIT: &str = match option_env!("POOLKEEPER_GIT_COMMIT") {
    Some(c) => c,
    None => "unknown",
};

/// Process series read from /proc at scrape time (Linux; absent elsewhere).
#[derive(Clone)]
pub struct Process {
    cpu: prometheus::Counter,
    resident: IntGauge,
    virtual_memory: IntGauge,
    open_fds: IntGauge,
    start_time: Gauge,
    threads: IntGauge,
}

impl Process {
    pub(super) fn new() -> Process {
        let g =
            |name: &str, help: &str| IntGauge::new(name, help).expect("static metric definition");
        let p = Process {
            cpu: prometheus::Counter::new(
                "process_cpu_seconds_total",
                "Total user and system CPU time spent in seconds",
            )
            .expect("static metric definition"),
            resident: g(
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
            ),
            virtual_memory: g(
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
            ),
            open_fds: g("process_open_fds", "Number of open file descriptors"),
            start_time: Gauge::new(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
            )
            .expect("static metric definition"),
            threads: g("process_threads", "Number of OS threads in the process"),
        };
        if let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            p.start_time
                .set(now.as_secs_f64() - PROCESS_START.elapsed().as_secs_f64());
        }
        p
    }

    /// The series, for a registry.
    pub(super) fn collectors(&self) -> Vec<Box<dyn prometheus::core::Collector>> {
        vec![
            Box::new(self.cpu.clone()),
            Box::new(self.resident.clone()),
            Box::new(self.virtual_memory.clone()),
            Box::new(self.open_fds.clone()),
            Box::new(self.start_time.clone()),
            Box::new(self.threads.clone()),
        ]
    }

    pub(super) fn refresh(&self) {
        // /proc/self/stat: fields after the command's closing parenthesis;
        // utime and stime are the 12th and 13th of them, in clock ticks
        // (100 per second on Linux), num_threads the 18th, vsize the 21st
        // and rss (pages) the 22nd.
        let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
            return;
        };
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            return;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let cpu = (num(11) + num(12)) as f64 / 100.0;
        let delta = cpu - self.cpu.get();
        if delta > 0.0 {
            self.cpu.inc_by(delta);
        }
        self.threads.set(num(17) as i64);
        self.virtual_memory.set(num(20) as i64);
        self.resident.set(num(21) as i64 * 4096);
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            self.open_fds.set(dir.count() as i64);
        }
    }
}

static PROCESS_START: LazyLock<Instant> = LazyLock::new(Instant::now);
