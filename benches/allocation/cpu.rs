//! CPU time spent by each side of a run, from /proc: the server process,
//! this bench process (the clients), and PostgreSQL (the postmaster, its
//! live children, and the children it has already reaped). On a machine
//! with few cores, CPU per reservation is what bounds the rate.

#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Cpu {
    pub server_s: f64,
    pub client_s: f64,
    pub postgres_s: f64,
}

impl Cpu {
    pub fn minus(self, before: Cpu) -> Cpu {
        Cpu {
            server_s: self.server_s - before.server_s,
            client_s: self.client_s - before.client_s,
            postgres_s: self.postgres_s - before.postgres_s,
        }
    }

    pub fn total_s(&self) -> f64 {
        self.server_s + self.client_s + self.postgres_s
    }
}

/// CPU per completed cycle, in milliseconds.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct CpuPerCycle {
    pub server_ms: f64,
    pub client_ms: f64,
    pub postgres_ms: f64,
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

#[derive(Debug, Clone, Copy, Default)]
pub struct Reading {
    cpu: Cpu,
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
        let postgres = self
            .postmaster
            .map(|pm| postgres_ticks(pm) as f64 / tps)
            .unwrap_or(0.0);
        let (machine_busy, machine_total) = machine().unwrap_or((0, 0));
        Reading {
            cpu: Cpu {
                server_s: own(self.server),
                client_s: own(Some(std::process::id())),
                postgres_s: postgres,
            },
            machine_busy,
            machine_total,
        }
    }
}

impl Reading {
    /// CPU since `before`, and the share of the machine that was busy.
    pub fn since(&self, before: &Reading) -> (Cpu, f64) {
        let busy = self.machine_busy.saturating_sub(before.machine_busy) as f64;
        let total = self.machine_total.saturating_sub(before.machine_total) as f64;
        (
            self.cpu.minus(before.cpu),
            if total > 0.0 { busy / total } else { 0.0 },
        )
    }
}

/// The postmaster's own CPU, its reaped children's, and its live children's.
fn postgres_ticks(postmaster: u32) -> u64 {
    let Some((_, own, reaped)) = stat(postmaster) else {
        return 0;
    };
    let mut total = own + reaped;
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if let Some((ppid, t, _)) = stat(pid)
                && ppid == postmaster
            {
                total += t;
            }
        }
    }
    total
}
