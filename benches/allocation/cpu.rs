//! CPU time spent by each side of a run, from /proc: the server process,
//! this bench process (the clients), and PostgreSQL (the postmaster, its
//! live children, and the children it has already reaped). On a machine
//! with few cores, CPU per reservation is what bounds the rate.

use std::collections::HashMap;

#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct Cpu {
    pub server_s: f64,
    pub client_s: f64,
    /// PostgreSQL backends (client connections) alive at the reading.
    pub postgres_s: f64,
    /// Everything else of PostgreSQL: checkpointer, writers, autovacuum,
    /// and processes already gone.
    pub postgres_bg_s: f64,
}

impl Cpu {
    pub fn minus(self, before: Cpu) -> Cpu {
        Cpu {
            server_s: self.server_s - before.server_s,
            client_s: self.client_s - before.client_s,
            postgres_s: self.postgres_s - before.postgres_s,
            postgres_bg_s: self.postgres_bg_s - before.postgres_bg_s,
        }
    }

    pub fn total_s(&self) -> f64 {
        self.server_s + self.client_s + self.postgres_s
    }
}

/// CPU per completed cycle, in milliseconds.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct CpuPerCycle {
    pub server_ms: f64,
    pub client_ms: f64,
    pub postgres_ms: f64,
    /// PostgreSQL's background processes (autovacuum, checkpointer, ...),
    /// not counted in `total_ms`: they work for every run alike.
    pub postgres_bg_ms: f64,
    pub total_ms: f64,
    /// Share of the machine's CPUs busy (all processes, from /proc/stat).
    pub machine_busy: f64,
}

impl CpuPerCycle {
    pub fn of(cpu: Cpu, cycles: u64, machine_busy: f64) -> CpuPerCycle {
        let per = |s: f64| {
            if cycles == 0 {
                0.0
            } else {
                s * 1000.0 / cycles as f64
            }
        };
        CpuPerCycle {
            server_ms: per(cpu.server_s),
            client_ms: per(cpu.client_s),
            postgres_ms: per(cpu.postgres_s),
            postgres_bg_ms: per(cpu.postgres_bg_s),
            total_ms: per(cpu.total_s()),
            machine_busy,
        }
    }

    pub fn median_of(runs: &[CpuPerCycle]) -> CpuPerCycle {
        let f = |get: fn(&CpuPerCycle) -> f64| {
            crate::stats::median(&runs.iter().map(get).collect::<Vec<_>>())
        };
        CpuPerCycle {
            server_ms: f(|c| c.server_ms),
            client_ms: f(|c| c.client_ms),
            postgres_ms: f(|c| c.postgres_ms),
            postgres_bg_ms: f(|c| c.postgres_bg_ms),
            total_ms: f(|c| c.total_ms),
            machine_busy: f(|c| c.machine_busy),
        }
    }
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// Fields of /proc/PID/stat after the command name: (ppid, utime+stime,
/// cutime+cstime) in ticks.
fn stat(pid: u32) -> Option<(u32, u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): ppid is field 4, utime 14, stime 15,
    // cutime 16, cstime 17.
    let n = |i: usize| f.get(i - 3).and_then(|v| v.parse::<u64>().ok());
    Some((n(4)? as u32, n(14)? + n(15)?, n(16)? + n(17)?))
}

/// The busy and total jiffies of the whole machine, from /proc/stat.
fn machine() -> Option<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let line = s.lines().next()?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

#[derive(Debug, Clone, Copy)]
pub struct Meter {
    pub server: Option<u32>,
    pub postmaster: Option<u32>,
}

#[derive(Debug, Clone, Default)]
pub struct Reading {
    cpu: Cpu,
    /// Live PostgreSQL backends: pid -> ticks.
    backends: HashMap<u32, u64>,
    /// The postmaster's own and reaped children's ticks, and its auxiliary
    /// processes' ticks.
    background: u64,
    machine_busy: u64,
    machine_total: u64,
}

impl Meter {
    /// The postmaster of the backend `backend_pid` (from pg_backend_pid()).
    pub fn new(server: Option<u32>, backend_pid: i32) -> Meter {
        let postmaster = stat(backend_pid as u32).map(|(ppid, _, _)| ppid);
        Meter { server, postmaster }
    }

    pub fn read(&self) -> Reading {
        let tps = ticks_per_second();
        let own = |pid: Option<u32>| {
            pid.and_then(stat)
                .map(|(_, t, _)| t as f64 / tps)
                .unwrap_or(0.0)
        };
        let (backends, background) = self.postmaster.map(postgres_ticks).unwrap_or_default();
        let (machine_busy, machine_total) = machine().unwrap_or((0, 0));
        Reading {
            cpu: Cpu {
                server_s: own(self.server),
                client_s: own(Some(std::process::id())),
                postgres_s: 0.0,
                postgres_bg_s: 0.0,
            },
            backends,
            background,
            machine_busy,
            machine_total,
        }
    }
}

impl Reading {
    /// CPU since `before`, and the share of the machine that was busy.
    ///
    /// Backends are followed by pid: one that ended during the interval
    /// moved its whole CPU into the postmaster's reaped total, so what it
    /// had at `before` is taken back out of the background's share (its last
    /// moments are lost, a few ticks at most).
    pub fn since(&self, before: &Reading) -> (Cpu, f64) {
        let tps = ticks_per_second();
        let busy = self.machine_busy.saturating_sub(before.machine_busy) as f64;
        let total = self.machine_total.saturating_sub(before.machine_total) as f64;
        let backends: u64 = self
            .backends
            .iter()
            .map(|(pid, t)| t.saturating_sub(before.backends.get(pid).copied().unwrap_or(0)))
            .sum();
        let gone: u64 = before
            .backends
            .iter()
            .filter(|(pid, _)| !self.backends.contains_key(pid))
            .map(|(_, t)| *t)
            .sum();
        let background = self
            .background
            .saturating_sub(before.background)
            .saturating_sub(gone);
        let mut cpu = self.cpu.minus(before.cpu);
        cpu.postgres_s = backends as f64 / tps;
        cpu.postgres_bg_s = background as f64 / tps;
        (cpu, if total > 0.0 { busy / total } else { 0.0 })
    }
}

/// PostgreSQL's CPU in ticks: live backends by pid, and everything else
/// (the postmaster, its auxiliary processes, the children it has reaped).
fn postgres_ticks(postmaster: u32) -> (HashMap<u32, u64>, u64) {
    let mut backends = HashMap::new();
    let Some((_, own, reaped)) = stat(postmaster) else {
        return (backends, 0);
    };
    let mut background = own + reaped;
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if let Some((ppid, t, _)) = stat(pid)
                && ppid == postmaster
            {
                if is_auxiliary(pid) {
                    background += t;
                } else {
                    backends.insert(pid, t);
                }
            }
        }
    }
    (backends, background)
}

/// A PostgreSQL child that serves no client: its title names its job.
fn is_auxiliary(pid: u32) -> bool {
    let title = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    [
        "checkpointer",
        "background writer",
        "walwriter",
        "autovacuum",
        "logical replication",
        "stats collector",
        "archiver",
        "startup",
    ]
    .iter()
    .any(|job| title.starts_with(&format!("postgres: {job}")))
}
